package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// nodekitBin is the nodekit binary built once for the package's tests: the agents are
// tested as their binaries.
var nodekitBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodekit-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	nodekitBin = filepath.Join(dir, "nodekit")
	// -race: the binary under test runs goroutines side by side (the control plane and
	// the nodes' runtimes start together); its races must fail the tests too.
	out, err := exec.Command("go", "build", "-race", "-tags", "grpcnotrace", "-o", nodekitBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build nodekit: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// nodekit runs the built binary and returns its stdout, stderr and exit status.
func nodekit(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(nodekitBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run nodekit %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func decodeDiagnosis(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("explain -o json printed %q: %v", s, err)
	}
	return m
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"explain"},
		{"explain", "pod", "x", "--kubeconfig", "/dev/null"},
		{"explain", "node", "a", "-o", "yaml"},
	} {
		_, stderr, code := nodekit(t, nil, args...)
		if code != exitError {
			t.Errorf("nodekit %q: exit %d, want %d (stderr %q)", args, code, exitError, stderr)
		}
		if stderr == "" {
			t.Errorf("nodekit %q: no message on stderr", args)
		}
	}
}
