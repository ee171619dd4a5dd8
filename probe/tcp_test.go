package probe_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/probe"
)

// A tcpSocket probe to a host name goes through net.Dialer, as the kubelet's:
// the same verdicts and messages as to an IP literal.
func TestTCPProbeByName(t *testing.T) {
	ln := closingListener(t)
	_, open := hostPort(t, ln.Addr().String())
	refused := freePort(t, "tcp4", "127.0.0.1:0")
	p := probe.NewProber(probe.Options{})
	ctx := context.Background()

	r, err := p.ProbeOnce(ctx, tcpSpec(open), probe.Target{Host: "localhost"})
	require.NoError(t, err)
	assert.Equal(t, probe.Success, r.Kind)

	r, err = p.ProbeOnce(ctx, tcpSpec(refused), probe.Target{Host: "localhost"})
	require.NoError(t, err)
	assert.Equal(t, probe.Failure, r.Kind)
	assert.Contains(t, r.Message, "dial tcp ")
	assert.Contains(t, r.Message, fmt.Sprintf(":%d: connect: connection refused", refused))
}

// ResetTCPProbes closes a tcpSocket probe with RST on the name path too: the
// server reads ECONNRESET instead of EOF.
func TestTCPProbeResetByName(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reset bool
	}{{"linger 1 s (kubelet)", false}, {"ResetTCPProbes", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			_, port := hostPort(t, ln.Addr().String())
			got := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- err
					return
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Read(make([]byte, 1))
				got <- err
			}()
			p := probe.NewProber(probe.Options{ResetTCPProbes: tc.reset})
			r, err := p.ProbeOnce(context.Background(), tcpSpec(port), probe.Target{Host: "localhost"})
			require.NoError(t, err)
			require.Equal(t, probe.Success, r.Kind)
			serverErr := <-got
			assert.Equal(t, tc.reset, errors.Is(serverErr, syscall.ECONNRESET), "server read: %v", serverErr)
		})
	}
}
