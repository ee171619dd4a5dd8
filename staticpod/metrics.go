package staticpod

import "time"

// Metrics receives the watcher's and the reconciler's measurements. Implementations
// must be safe for concurrent use. The agents adapt it to Prometheus; the library
// stays free of a metrics dependency.
type Metrics interface {
	// ObserveScan records one full read of the folder: its duration and how many
	// manifest candidates it found.
	ObserveScan(d time.Duration, files int)
	// IncManifestError counts a newly reported broken manifest; reason is the
	// sentinel's text (ErrSyntax.Error(), ...).
	IncManifestError(reason string)
	// ObserveEvent counts an emitted event by type.
	ObserveEvent(t EventType)
	// IncMirrorOp counts a mirror pod API call: op is "create", "delete" or
	// "adopt" (AlreadyExists with the same hash); failed tells whether it errored.
	IncMirrorOp(op string, failed bool)
}

type noopMetrics struct{}

func (noopMetrics) ObserveScan(time.Duration, int) {}
func (noopMetrics) IncManifestError(string)        {}
func (noopMetrics) ObserveEvent(EventType)         {}
func (noopMetrics) IncMirrorOp(string, bool)       {}
