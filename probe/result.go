package probe

import (
	"errors"
	"fmt"
)

// Kind is the outcome class of one probe attempt. The string values match the
// kubelet's pkg/probe result strings.
type Kind string

const (
	// Success means the target answered as healthy.
	Success Kind = "success"
	// Warning means the probe passed with a caveat (an HTTP redirect that was not
	// followed). The kubelet counts it as Success and records a ProbeWarning event.
	Warning Kind = "warning"
	// Failure means the target answered as unhealthy, or could not be reached.
	Failure Kind = "failure"
	// Unknown means the probe could not be run; it comes with an error. The kubelet
	// counts it as Failure.
	Unknown Kind = "unknown"
)

// Result is the outcome of one probe: its kind and the human message the kubelet
// would log or put in an event. HTTP failure messages never carry the body.
type Result struct {
	Kind    Kind
	Message string
}

// Healthy reports whether the kubelet would count the result as Success
// (Success or Warning).
func (r Result) Healthy() bool { return r.Kind == Success || r.Kind == Warning }

// Type says which of a container's probes a worker runs.
type Type int

const (
	// Liveness probes restart the container when they fail.
	Liveness Type = iota
	// Readiness probes gate the container's Ready condition.
	Readiness
	// Startup probes hold liveness and readiness back until the container started.
	Startup
)

// String returns the label the kubelet uses for the probe_type metric label and in
// events: "Liveness", "Readiness" or "Startup".
func (t Type) String() string {
	switch t {
	case Liveness:
		return "Liveness"
	case Readiness:
		return "Readiness"
	case Startup:
		return "Startup"
	default:
		return fmt.Sprintf("Type(%d)", int(t))
	}
}

// Sentinel errors. Every error the package returns wraps one of them, so callers
// can test with errors.Is.
var (
	// ErrInvalidProbe marks a probe spec that the API server would refuse: nil,
	// no handler, more than one handler, a negative field, a bad port or scheme,
	// a successThreshold other than 1 on a liveness or startup probe.
	ErrInvalidProbe = errors.New("invalid probe")
	// ErrNoHandler marks a probe that sets none of exec, httpGet, tcpSocket, grpc.
	// It also matches ErrInvalidProbe.
	ErrNoHandler = fmt.Errorf("%w: must specify a handler type", ErrInvalidProbe)
	// ErrMultipleHandlers marks a probe that sets more than one handler.
	// It also matches ErrInvalidProbe.
	ErrMultipleHandlers = fmt.Errorf("%w: may not specify more than 1 handler type", ErrInvalidProbe)
	// ErrNilProbe marks a nil probe spec. It also matches ErrInvalidProbe.
	ErrNilProbe = fmt.Errorf("%w: probe is nil", ErrInvalidProbe)
	// ErrUnknownPort marks a named port that the container does not declare.
	ErrUnknownPort = errors.New("port not found")
	// ErrInvalidPort marks a port outside 1-65535.
	ErrInvalidPort = errors.New("invalid port number")
	// ErrNoExecer marks an exec probe run by a Prober that has no Execer.
	ErrNoExecer = errors.New("no execer configured for exec probes")
	// ErrExecTimeout is what an Execer wraps when the command outlived its
	// timeout; the probe then reports Failure, as with CRI's ExecSync.
	ErrExecTimeout = errors.New("command timed out")
	// ErrInvalidConfig marks a Manager Config that cannot work.
	ErrInvalidConfig = errors.New("invalid probe manager config")
)
