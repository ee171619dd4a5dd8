package podsync

import (
	"bytes"
	"fmt"
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

// OSFiles is a FileReader over os.ReadFile.
type OSFiles struct{}

// ReadFile calls os.ReadFile.
func (OSFiles) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

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
			data, err := files.ReadFile(m.GetHostPath())
			switch {
			case err != nil && os.IsNotExist(err):
			case err != nil:
				return fmt.Sprintf("Error on reading termination log %s: %v", m.GetHostPath(), err)
			default:
				if len(data) > MaxTerminationMessageLength {
					data = data[len(data)-MaxTerminationMessageLength:]
				}
				msg = string(data)
				checkLogs = fallback && len(data) == 0
			}
			break
		}
	}
	if !checkLogs || c.GetLogPath() == "" {
		return msg
	}
	data, err := files.ReadFile(c.GetLogPath())
	if err != nil {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
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
