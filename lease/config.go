package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// The kubelet's values (KubeletConfiguration.nodeLeaseDurationSeconds and the
// renew fraction hard-wired in pkg/kubelet).
const (
	// DefaultDuration is the lease duration the kubelet writes (nodeLeaseDurationSeconds).
	DefaultDuration = 40 * time.Second
	// RenewFraction is the share of the duration between two renewals (10s for 40s).
	RenewFraction = 0.25
	// RenewJitter is the jitter factor on each renew wait: the wait is drawn from
	// [interval, interval*(1+RenewJitter)).
	RenewJitter = 0.04
	// MaxUpdateTries is how many Updates one renewal round attempts before it falls
	// back to a GET (and, on the next round, starts over).
	MaxUpdateTries = 5
	// InitialBackoff is the first wait after a failed GET or Create of the lease.
	InitialBackoff = 200 * time.Millisecond
	// MaxBackoff caps the doubling wait between failed GET/Create attempts.
	MaxBackoff = 7 * time.Second
)

// Sentinel errors. Errors returned by this package wrap one of them with %w and
// name the lease at fault.
var (
	// ErrInvalidConfig is returned by New and NewWatcher for a configuration they refuse.
	ErrInvalidConfig = errors.New("invalid lease configuration")
	// ErrAlreadyRunning is returned by Run when the same Controller or Watcher is
	// already running in another goroutine.
	ErrAlreadyRunning = errors.New("already running")
	// ErrIncompleteLease is returned by Expiry for a lease without renewTime or
	// leaseDurationSeconds.
	ErrIncompleteLease = errors.New("lease has no renewTime or leaseDurationSeconds")
)

// OwnerFunc returns the owner reference the lease should carry. The controller
// calls it only while the lease has no owner references at all, before each Create
// and Update. An error skips that write (see the package comment): the kubelet
// never writes a node lease it cannot tie to its Node.
type OwnerFunc func(ctx context.Context) (metav1.OwnerReference, error)

// Config configures a Controller. The zero value of every optional field means
// the documented default; Client, Namespace, Name and HolderIdentity are required.
type Config struct {
	// Client reaches the API server. Required.
	Client kubernetes.Interface

	// Namespace of the Lease. Required ("kube-node-lease" for node heartbeats).
	Namespace string
	// Name of the Lease. Required (the node name for node heartbeats).
	Name string
	// HolderIdentity is written to spec.holderIdentity. Required (the node name for
	// node heartbeats).
	HolderIdentity string

	// Duration is written to spec.leaseDurationSeconds, so it must be a whole number
	// of seconds. Zero means DefaultDuration (40s); negative is an error.
	Duration time.Duration
	// RenewInterval is the base wait between two renewal rounds; each wait adds up
	// to RenewJitter of it. Zero means RenewFraction of Duration (10s for 40s). It
	// must be positive and shorter than Duration.
	RenewInterval time.Duration

	// Owner, when set, supplies the lease's owner reference (NodeOwner for a node
	// lease). Nil means the lease carries no owner reference.
	Owner OwnerFunc

	// OnRepeatedFailure is called on the second and later failed Update of one
	// renewal round (not for Conflicts), as the kubelet's onRepeatedHeartbeatFailure
	// hook is; the kubelet uses it to close idle connections. It runs on the
	// renewing goroutine and must return quickly. Nil means no callback.
	OnRepeatedFailure func()

	// Clock times every wait. Nil means the real clock.
	Clock clock.WithTicker
	// Metrics receives renew latency and failures. Nil means no metrics.
	Metrics Metrics
}

// NodeConfig returns the kubelet's configuration for nodeName's heartbeat: lease
// kube-node-lease/<nodeName>, holder <nodeName>, 40s duration renewed every 10s,
// owned by the Node (looked up through client). Adjust the returned Config (Clock,
// Metrics, OnRepeatedFailure, a shorter Duration for tests) and pass it to New.
func NodeConfig(client kubernetes.Interface, nodeName string) Config {
	return Config{
		Client:         client,
		Namespace:      corev1.NamespaceNodeLease,
		Name:           nodeName,
		HolderIdentity: nodeName,
		Owner:          NodeOwner(client, nodeName),
	}
}

// NodeOwner returns an OwnerFunc that GETs the Node nodeName and refers to it as
// {apiVersion: v1, kind: Node, name, uid}. While the Node does not exist it returns
// the API error, so the lease is not written until the Node is registered.
func NodeOwner(client kubernetes.Interface, nodeName string) OwnerFunc {
	return func(ctx context.Context) (metav1.OwnerReference, error) {
		node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return metav1.OwnerReference{}, fmt.Errorf("get Node %q for the lease owner reference: %w", nodeName, err)
		}
		return metav1.OwnerReference{
			APIVersion: "v1",
			Kind:       "Node",
			Name:       node.Name,
			UID:        node.UID,
		}, nil
	}
}

// withDefaults returns cfg with defaults applied, or an error naming what is wrong.
func (cfg Config) withDefaults() (Config, error) {
	ref := cfg.Namespace + "/" + cfg.Name
	var problems []error
	if cfg.Client == nil {
		problems = append(problems, errors.New("nil Client"))
	}
	if cfg.Namespace == "" {
		problems = append(problems, errors.New("empty Namespace"))
	}
	if cfg.Name == "" {
		problems = append(problems, errors.New("empty Name"))
	}
	if cfg.HolderIdentity == "" {
		problems = append(problems, errors.New("empty HolderIdentity"))
	}
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	switch {
	case cfg.Duration < time.Second:
		problems = append(problems, fmt.Errorf("Duration %v is not positive whole seconds", cfg.Duration))
	case cfg.Duration%time.Second != 0:
		problems = append(problems, fmt.Errorf("Duration %v is not a whole number of seconds", cfg.Duration))
	case cfg.Duration > (1<<31-1)*time.Second:
		problems = append(problems, fmt.Errorf("Duration %v does not fit leaseDurationSeconds", cfg.Duration))
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = time.Duration(float64(cfg.Duration) * RenewFraction)
	}
	if cfg.RenewInterval <= 0 {
		problems = append(problems, fmt.Errorf("RenewInterval %v is not positive", cfg.RenewInterval))
	} else if cfg.RenewInterval >= cfg.Duration {
		problems = append(problems, fmt.Errorf("RenewInterval %v is not shorter than Duration %v", cfg.RenewInterval, cfg.Duration))
	}
	if len(problems) > 0 {
		return cfg, fmt.Errorf("lease %s: %w: %w", ref, ErrInvalidConfig, errors.Join(problems...))
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	return cfg, nil
}
