package podsync

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

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
// FallbackToLogsOnError, a non-zero exit code (and a reason other than
// ContainerCannotRun) and no file content, the last 2048 bytes of the last 80
// records of its CRI log.
func TerminationMessage(c *runtimeapi.ContainerStatus, files FileReader) string {
	path := c.GetAnnotations()[AnnotationTerminationMessagePath]
	// A container that could not even be started has no log to fall back to.
	fallback := c.GetAnnotations()[AnnotationTerminationMessagePolicy] == string(corev1.TerminationMessageFallbackToLogsOnError) &&
		c.GetExitCode() != 0 && c.GetReason() != "ContainerCannotRun"
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

// lastLogText decodes a CRI log ("<time> <stream> <P|F> <text>" per record) as
// the kubelet's log reader does with a tail of MaxTerminationMessageLogLines:
// it starts at the last 80 newline-terminated records and writes up to 80
// records from there, a full record's text with its newline and a partial
// one's without (so `echo -n DONE` reads "DONE"); records that do not parse
// are skipped. Of what it writes, the last MaxTerminationMessageLogLength
// bytes are kept.
func lastLogText(data []byte) string {
	// The record after the (80+1)th newline from the end starts the tail.
	start, seen := 0, 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] != '\n' {
			continue
		}
		if seen++; seen > MaxTerminationMessageLogLines {
			start = i + 1
			break
		}
	}
	var out []byte
	written := 0
	for rest := data[start:]; len(rest) > 0 && written < MaxTerminationMessageLogLines; {
		rec := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			rec, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		text, ok := parseCRILogRecord(rec)
		if !ok {
			continue
		}
		out = append(out, text...)
		written++
	}
	if len(out) > MaxTerminationMessageLogLength {
		out = out[len(out)-MaxTerminationMessageLogLength:]
	}
	return string(out)
}

// parseCRILogRecord returns the text of one CRI log record (with its trailing
// newline, if any, unless the record is partial), or false when the record has
// no RFC 3339 time, no stdout/stderr stream or no tag.
func parseCRILogRecord(rec []byte) ([]byte, bool) {
	ts, rest, ok := bytes.Cut(rec, []byte{' '})
	if !ok {
		return nil, false
	}
	if _, err := time.Parse(time.RFC3339Nano, string(ts)); err != nil {
		return nil, false
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != "stdout" && string(stream) != "stderr") {
		return nil, false
	}
	tags, text, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return nil, false
	}
	if tag, _, _ := bytes.Cut(tags, []byte{':'}); string(tag) == "P" {
		text = bytes.TrimSuffix(text, []byte{'\n'})
	}
	return text, true
}
