package podenv

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// envFileValue reads key from an env file in the strict format of the kubelet's
// EnvFiles feature (pkg/kubelet/util/env, v1.37.2): KEY='value' lines, values in
// single quotes taken literally and possibly spanning lines, # comments, blank
// lines skipped; "KEY= 'v'" (a space after =) assigns "". It returns "" when
// the key is absent, as upstream does, so an empty value and a missing key are
// the same to the caller.
func envFileValue(path, key string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("failed to open environment variable file %q: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimLeft(sc.Text(), " \t")
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		name, value, found := strings.Cut(text, "=")
		if !found {
			return "", fmt.Errorf("invalid environment variable format at line %d: missing '='", line)
		}
		trimmedName := strings.TrimRight(name, " \t")
		if trimmedName == "" {
			return "", fmt.Errorf("invalid environment variable format at line %d: empty variable name", line)
		}
		if trimmedName != name {
			return "", fmt.Errorf("invalid environment variable format at line %d: whitespace before '=' is not allowed", line)
		}
		if trimmed := strings.TrimLeft(value, " \t"); trimmed != value {
			// Like a shell: KEY= 'x' sets KEY to "" (and runs 'x').
			if name == key {
				return "", nil
			}
			continue
		}
		if !strings.HasPrefix(value, "'") {
			return "", fmt.Errorf("invalid environment variable format at line %d: value must be enclosed in single quotes", line)
		}
		var b strings.Builder
		rest, start := value[1:], line
		for {
			if end := strings.IndexByte(rest, '\''); end >= 0 {
				b.WriteString(rest[:end])
				after := strings.TrimLeft(rest[end+1:], " \t")
				if after != "" && !strings.HasPrefix(after, "#") {
					return "", fmt.Errorf("invalid environment variable format at line %d: unexpected content after closing quote", line)
				}
				if name == key {
					return b.String(), nil
				}
				break
			}
			b.WriteString(rest)
			b.WriteByte('\n')
			if !sc.Scan() {
				return "", fmt.Errorf("invalid environment variable format starting at line %d: unclosed single quote", start)
			}
			line++
			rest = sc.Text()
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("error reading environment variable file %q: %w", path, err)
	}
	return "", nil
}
