package probe

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// TestMain doubles as the out-of-process server for the benchmarks: with
// PROBE_BENCH_SERVER=1 the binary serves HTTP and gRPC health, prints
// "host httpPort grpcPort" and waits for stdin to close. Serving from another
// process keeps server-side allocations out of allocs/op.
func TestMain(m *testing.M) {
	if os.Getenv("PROBE_BENCH_SERVER") == "1" {
		t := &testing.T{}
		host, port, _ := newHTTPServers(t)
		_, gport := grpcSrv(t, "health")
		fmt.Printf("%s %d %d\n", host, port, gport)
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// remoteServers starts the server process and returns its address.
func remoteServers(b *testing.B) (host string, httpPort, grpcPort int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "PROBE_BENCH_SERVER=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	if _, err := fmt.Fscan(bufio.NewReader(out), &host, &httpPort, &grpcPort); err != nil {
		b.Fatal(err)
	}
	return host, httpPort, grpcPort
}
