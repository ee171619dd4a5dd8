package podsync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's termination message limits.
const (
	// MaxTerminationMessageLength caps a message read from the file (4 KiB).
	MaxTerminationMessageLength = 4096
	// MaxTerminationMessageLogLines and MaxTerminationMessageLogLength bound the
	// log tail used by FallbackToLogsOnError: the last 80 lines, of which the
	// last 2048 bytes.
	MaxTerminationMessageLogLines  = 80
	MaxTerminationMessageLogLength = 2048
)

// FileReader reads files on the node: termination message files and container
// logs. OSFiles reads the real filesystem.
type FileReader interface {
	ReadFile(path string) ([]byte, error)
}

// TailReader is optional on a FileReader: ReadTail returns at most the last
// limit bytes of a file, so a long container log is not read whole. OSFiles has it.
type TailReader interface {
	ReadTail(path string, limit int64) ([]byte, error)
}

// logTailWindow bounds how much of a container log is read for the fallback
// message: far more than 80 lines of 2 KiB of text need, unless lines are
// enormous, in which case the last 2 KiB lie inside it anyway.
const logTailWindow = 256 << 10

// OSFiles is a FileReader over the node's filesystem.
type OSFiles struct{}

// ReadFile calls os.ReadFile.
func (OSFiles) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

// ReadTail reads the last limit bytes of path (the whole file when shorter).
func (OSFiles) ReadTail(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := st.Size() - limit
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

// readTail reads the last limit bytes through files, with ReadTail when it can.
func readTail(files FileReader, path string, limit int64) ([]byte, error) {
	if t, ok := files.(TailReader); ok {
		return t.ReadTail(path, limit)
	}
	data, err := files.ReadFile(path)
	if err == nil && int64(len(data)) > limit {
		data = data[int64(len(data))-limit:]
	}
	return data, err
}

// TerminationMessage returns the termination message of an exited container as
// the kubelet finds it: the last 4096 bytes of the host file mounted at the
// container's terminationMessagePath (from its annotation); or, with policy
// FallbackToLogsOnError, a non-zero exit code and no file content, the last
// 2048 bytes of the last 80 lines of its CRI log.
func TerminationMessage(c *runtimeapi.ContainerStatus, files FileReader) string {
	path := c.GetAnnotations()[AnnotationTerminationMessagePath]
	fallback := c.GetAnnotations()[AnnotationTerminationMessagePolicy] == string(corev1.TerminationMessageFallbackToLogsOnError) &&
		c.GetExitCode() != 0
	checkLogs := fallback
	var msg string
	if path != "" {
		for _, m := range c.GetMounts() {
			if m.GetContainerPath() != path {
				continue
			}
			data, err := readTail(files, m.GetHostPath(), MaxTerminationMessageLength)
			switch {
			case err != nil && os.IsNotExist(err):
			case err != nil:
				return fmt.Sprintf("Error on reading termination log %s: %v", m.GetHostPath(), err)
			default:
				msg = string(data)
				checkLogs = fallback && len(data) == 0
			}
			break
		}
	}
	if !checkLogs || c.GetLogPath() == "" {
		return msg
	}
	data, err := readTail(files, c.GetLogPath(), logTailWindow)
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	if int64(len(data)) == logTailWindow {
		// The window may start mid-line: drop that partial first line.
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return lastLogText(data)
}

// lastLogText decodes a CRI log ("<time> <stream> <P|F> <text>" per line),
// joins partial lines, and keeps the last MaxTerminationMessageLogLength bytes
// of the last MaxTerminationMessageLogLines lines.
func lastLogText(data []byte) string {
	var lines []string
	var partial strings.Builder
	for _, raw := range bytes.Split(data, []byte("\n")) {
		if len(raw) == 0 {
			continue
		}
		f := strings.SplitN(string(raw), " ", 4)
		if len(f) < 3 {
			continue
		}
		text := ""
		if len(f) == 4 {
			text = f[3]
		}
		partial.WriteString(text)
		if f[2] == "P" {
			continue
		}
		lines = append(lines, partial.String()+"\n")
		partial.Reset()
	}
	if len(lines) > MaxTerminationMessageLogLines {
		lines = lines[len(lines)-MaxTerminationMessageLogLines:]
	}
	out := strings.Join(lines, "")
	if len(out) > MaxTerminationMessageLogLength {
		out = out[len(out)-MaxTerminationMessageLogLength:]
	}
	return out
}
