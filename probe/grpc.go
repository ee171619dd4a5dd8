package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A gRPC probe is the kubelet's (pkg/probe/grpc): a new grpc-go ClientConn per
// probe, a blocking wait until it is ready, then grpc.health.v1.Health/Check.
// grpc-go is what decides how a server's HTTP/2 frames, headers, trailers,
// flow control and status details turn into a status, so using it is what
// makes the verdict and the message the kubelet's for any server, including
// broken ones. An HTTP/2 client written here disagreed with the kubelet on
// 208 of 400 random servers (upstream/probe TestRandomGRPCServers); see
// docs/probe.md for the measurements behind this choice.
//
// Nothing of the connection is kept between probes: a fresh connection per
// probe is what the kubelet observes (a server that stopped accepting new
// connections fails), and a Prober needs no Close.

// probeGRPC runs one health check against host:port within timeout.
func (p *Prober) probeGRPC(ctx context.Context, host, service string, port int, timeout time.Duration, useTLS bool) Result {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as the kubelet's
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// passthrough is the scheme grpc.DialContext (the kubelet's call) defaults
	// to: the address is dialled as written, no resolver or DNS lookup.
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithUserAgent(p.opts.UserAgent),
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return p.dialer.DialContext(ctx, "tcp", a)
		}),
	)
	if err != nil {
		return Result{Kind: Failure, Message: fmt.Sprintf("error: failed to connect service at %q: %+v", addr, err)}
	}
	defer func() { _ = conn.Close() }()
	// Wait until the connection is ready, as the kubelet's grpc.WithBlock dial
	// does: connection failures are retried with grpc-go's backoff until the
	// timeout, and never reported but as that timeout.
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if s == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, s) {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return Result{Kind: Failure, Message: fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, context.DeadlineExceeded)}
			}
			return Result{Kind: Failure, Message: fmt.Sprintf("error: failed to connect service at %q: %+v", addr, ctx.Err())}
		}
	}
	// The kubelet attaches empty outgoing metadata; kept so the call is the
	// same call.
	resp, err := healthpb.NewHealthClient(conn).Check(metadata.NewOutgoingContext(ctx, metadata.MD{}), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return grpcFailure(err, timeout)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return Result{Kind: Failure, Message: fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String())}
	}
	return Result{Kind: Success, Message: "service healthy"}
}

// grpcFailure is the kubelet's message for a Check that returned err.
func grpcFailure(err error, timeout time.Duration) Result {
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unimplemented:
			return Result{Kind: Failure, Message: "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): " + st.Message()}
		case codes.DeadlineExceeded:
			return Result{Kind: Failure, Message: fmt.Sprintf("timeout: health rpc did not complete within %v", timeout)}
		}
	}
	return Result{Kind: Failure, Message: fmt.Sprintf("error: health rpc probe failed: %+v", err)}
}
