package cri

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Errors returned by Client calls wrap one of the first four when the
// runtime's gRPC status says so, and keep the gRPC status itself: status.Code(err) and
// status.FromError(err) still work on them.
var (
	// ErrNotFound: the runtime does not know the sandbox, container or image (codes.NotFound).
	ErrNotFound = errors.New("not found")
	// ErrNotSupported: the runtime does not implement the call (codes.Unimplemented),
	// e.g. containerd 1.6 and RuntimeConfig.
	ErrNotSupported = errors.New("not supported by the runtime")
	// ErrUnavailable: the runtime cannot be reached (codes.Unavailable): its socket is
	// missing, or it is down or restarting.
	ErrUnavailable = errors.New("runtime unavailable")
	// ErrTimeout: the call outlived its deadline (codes.DeadlineExceeded). For ExecSync
	// it means the command outlived its timeout.
	ErrTimeout = errors.New("timed out")

	// ErrInvalidEndpoint: the endpoint is neither unix:///absolute/path nor an absolute path.
	ErrInvalidEndpoint = errors.New("invalid CRI endpoint")
	// ErrNoRuntime: no endpoint was given and none of DefaultEndpoints has a socket.
	ErrNoRuntime = errors.New("no CRI runtime socket found")
	// ErrInvalidPod: a Pod cannot be turned into a CRI config (no name, namespace or UID,
	// unknown container).
	ErrInvalidPod = errors.New("invalid pod")
	// ErrInvalidResponse: the runtime answered without a field the call needs (an empty
	// sandbox ID, a nil status).
	ErrInvalidResponse = errors.New("invalid runtime response")
)

// Error is a failed CRI call. It names the call and the object, wraps the matching
// sentinel (errors.Is) and the original gRPC error (errors.As, status.FromError).
type Error struct {
	// Call is the CRI method, e.g. "RunPodSandbox".
	Call string
	// Object names what the call was about, e.g. `pod "default/web"`, `container "3f2a..."`.
	// Empty for calls about the runtime itself.
	Object string
	// Err is the error the gRPC client returned.
	Err error

	kind error
}

func (e *Error) Error() string {
	msg := e.Err.Error()
	if s, ok := status.FromError(e.Err); ok {
		msg = fmt.Sprintf("%s (%s)", s.Message(), s.Code())
	}
	if e.Object == "" {
		return fmt.Sprintf("cri %s: %s", e.Call, msg)
	}
	return fmt.Sprintf("cri %s %s: %s", e.Call, e.Object, msg)
}

// Unwrap exposes both the sentinel and the gRPC error.
func (e *Error) Unwrap() []error {
	if e.kind == nil {
		return []error{e.Err}
	}
	return []error{e.kind, e.Err}
}

// GRPCStatus returns the runtime's status, so status.FromError and status.Code see it.
func (e *Error) GRPCStatus() *status.Status {
	s, _ := status.FromError(e.Err)
	return s
}

// wrapError turns a gRPC error into an *Error; nil stays nil.
func wrapError(call, object string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Call: call, Object: object, Err: err, kind: kindOf(err)}
}

func kindOf(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return ErrTimeout
	}
	switch status.Code(err) {
	case codes.NotFound:
		return ErrNotFound
	case codes.Unimplemented:
		return ErrNotSupported
	case codes.Unavailable:
		return ErrUnavailable
	case codes.DeadlineExceeded:
		return ErrTimeout
	}
	return nil
}
