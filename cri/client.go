package cri

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"
)

const (
	// MaxMessageSize is the gRPC message size limit the kubelet uses for CRI (16 MiB;
	// gRPC's default of 4 MiB is too small for big ListContainers answers).
	MaxMessageSize = 16 << 20
	// DefaultCallTimeout is the kubelet's --runtime-request-timeout default.
	DefaultCallTimeout = 2 * time.Minute
	// DefaultConnectTimeout bounds the Version check New makes.
	DefaultConnectTimeout = 10 * time.Second
)

// Reconnection backoff, the values the kubelet's CRI client uses: a restarted runtime
// is found again within about 3 s.
const (
	baseBackoffDelay  = 100 * time.Millisecond
	maxBackoffDelay   = 3 * time.Second
	minConnectTimeout = 5 * time.Second
)

// Config configures a Client. The zero value is usable: it discovers the runtime.
type Config struct {
	// Endpoint is the runtime's socket, as unix:///path or /path. Default: the first of
	// DefaultEndpoints whose socket exists.
	Endpoint string
	// ConnectTimeout bounds New's Version check. Default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// CallTimeout bounds each call, as the kubelet's --runtime-request-timeout does.
	// RunPodSandbox gets twice as much, ExecSync gets the command's timeout on top,
	// PullImage is bounded by ctx alone (pulls are long). Default DefaultCallTimeout.
	CallTimeout time.Duration
	// DialOptions are appended to the client's own when New dials.
	DialOptions []grpc.DialOption
	// Metrics observes every call. Default: no-op.
	Metrics Metrics
	// Clock paces WaitReady. Default: real.
	Clock clock.WithTicker
}

// Metrics observes CRI calls. Operation names are the kubelet's ("run_podsandbox",
// "exec_sync", "pull_image", ...) so an adapter can feed
// kubelet_runtime_operations_total, kubelet_runtime_operations_duration_seconds and
// kubelet_runtime_operations_errors_total. Implementations must be safe for concurrent use.
type Metrics interface {
	RuntimeOperation(operation string, d time.Duration, err error)
}

// Client talks CRI runtime/v1 (RuntimeService and ImageService) to one runtime over one
// gRPC connection. It is safe for concurrent use. When the runtime restarts, gRPC
// reconnects on its own; calls made while it is down fail with ErrUnavailable.
type Client struct {
	conn     *grpc.ClientConn
	owned    bool
	endpoint string
	runtime  runtimeapi.RuntimeServiceClient
	images   runtimeapi.ImageServiceClient
	timeout  time.Duration
	metrics  Metrics // nil: none
	clock    clock.WithTicker
	version  *runtimeapi.VersionResponse
}

// New dials the runtime at cfg.Endpoint (or discovers it) and checks that it serves CRI
// runtime/v1 with a Version call. A missing socket returns ErrUnavailable at once; a
// runtime that serves no CRI v1 returns ErrNotSupported.
func New(ctx context.Context, cfg Config) (*Client, error) {
	endpoint := cfg.Endpoint
	if endpoint == "" {
		var err error
		if endpoint, err = DiscoverEndpoint(nil); err != nil {
			return nil, err
		}
	}
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("cri: connect %s: %w: %w", endpoint, ErrUnavailable, err)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: baseBackoffDelay, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoffDelay},
			MinConnectTimeout: minConnectTimeout,
		}),
	}
	conn, err := grpc.NewClient("unix://"+path, append(opts, cfg.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("cri: dial %s: %w", endpoint, err)
	}
	c, err := newClient(ctx, conn, "unix://"+path, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.owned = true
	return c, nil
}

// NewWithConn uses an existing connection (an in-process server over bufconn, a
// connection shared with other clients). Close does not close conn. cfg.Endpoint and
// cfg.DialOptions are ignored; the Version check still runs.
func NewWithConn(ctx context.Context, conn *grpc.ClientConn, cfg Config) (*Client, error) {
	if conn == nil {
		return nil, errors.New("cri: NewWithConn: nil connection")
	}
	return newClient(ctx, conn, conn.Target(), cfg)
}

func newClient(ctx context.Context, conn *grpc.ClientConn, endpoint string, cfg Config) (*Client, error) {
	c := &Client{
		conn:     conn,
		endpoint: endpoint,
		runtime:  runtimeapi.NewRuntimeServiceClient(conn),
		images:   runtimeapi.NewImageServiceClient(conn),
		timeout:  cfg.CallTimeout,
		metrics:  cfg.Metrics,
		clock:    cfg.Clock,
	}
	if c.timeout <= 0 {
		c.timeout = DefaultCallTimeout
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	connectTimeout := cfg.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	vctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// WaitForReady: a socket that exists but whose runtime is still starting is given
	// until the connect timeout.
	v, err := c.runtime.Version(vctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
	if err != nil {
		err = wrapError("Version", "", err)
		if errors.Is(err, ErrNotSupported) {
			return nil, fmt.Errorf("cri: %s does not serve CRI runtime.v1: %w", endpoint, err)
		}
		return nil, fmt.Errorf("cri: connect %s: %w", endpoint, err)
	}
	c.version = v
	logr.FromContextOrDiscard(ctx).V(4).Info("Connected to CRI runtime", "endpoint", endpoint,
		"runtime", v.GetRuntimeName(), "version", v.GetRuntimeVersion(), "apiVersion", v.GetRuntimeApiVersion())
	return c, nil
}

// Close closes the connection New opened. It does nothing for NewWithConn clients.
func (c *Client) Close() error {
	if c.owned {
		return c.conn.Close()
	}
	return nil
}

// Endpoint is the runtime's endpoint.
func (c *Client) Endpoint() string { return c.endpoint }

// RuntimeVersion is the Version answer New got at connect time.
func (c *Client) RuntimeVersion() *runtimeapi.VersionResponse { return c.version }

// RuntimeService and ImageService give the raw clients for calls this package does not
// wrap (streaming, stats, checkpoints). Their errors are not mapped.
func (c *Client) RuntimeService() runtimeapi.RuntimeServiceClient { return c.runtime }

// ImageService gives the raw image client; see RuntimeService.
func (c *Client) ImageService() runtimeapi.ImageServiceClient { return c.images }

// do runs one call under timeout (0: ctx alone), observes it and maps its error.
// The success path does no formatting or logging: obj is formatted only when the
// call fails.
func (c *Client) do(ctx context.Context, op, call string, obj object, timeout time.Duration, f func(context.Context) error) error {
	if timeout > 0 {
		// A caller's deadline that comes first bounds the call on its own; a second
		// timer would never fire.
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > timeout {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
	}
	var err error
	if c.metrics == nil {
		err = f(ctx)
	} else {
		start := c.clock.Now()
		err = f(ctx)
		c.metrics.RuntimeOperation(op, c.clock.Since(start), err)
	}
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.Unavailable {
		// The runtime went away: try to reconnect now rather than at the end of a
		// backoff step, so a restarted runtime is found by the next call.
		c.conn.ResetConnectBackoff()
	}
	object := obj.String()
	logr.FromContextOrDiscard(ctx).V(4).Info("CRI call failed", "call", call, "object", object, "err", err)
	return wrapError(call, object, err)
}

// object names what a call is about, for errors. It is a value so that successful
// calls never format it.
type object struct {
	kind string // "pod", "pod sandbox", "container", "image"; "" for the runtime itself
	name string
	// sandbox is the sandbox a container is created in (CreateContainer).
	sandbox string
	// cmd is the command of an ExecSync.
	cmd []string
}

func (o object) String() string {
	if o.kind == "" {
		return ""
	}
	s := fmt.Sprintf("%s %q", o.kind, o.name)
	if o.sandbox != "" {
		s += fmt.Sprintf(" in pod sandbox %q", o.sandbox)
	}
	if o.cmd != nil {
		s += fmt.Sprintf(" command %q", o.cmd)
	}
	return s
}

func podObject(cfg *runtimeapi.PodSandboxConfig) object {
	m := cfg.GetMetadata()
	return object{kind: "pod", name: m.GetNamespace() + "/" + m.GetName()}
}

func sandboxObject(id string) object   { return object{kind: "pod sandbox", name: id} }
func containerObject(id string) object { return object{kind: "container", name: id} }
func imageObject(image string) object  { return object{kind: "image", name: image} }

// WaitReady blocks until the runtime answers Version, polling every interval (default
// 200ms), or ctx ends. Use it after a runtime restart.
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	t := c.clock.NewTicker(interval)
	defer t.Stop()
	for {
		_, err := c.Version(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cri: wait for %s: %w (last error: %w)", c.endpoint, ctx.Err(), err)
		case <-t.C():
		}
	}
}

// Version asks the runtime its name and versions.
func (c *Client) Version(ctx context.Context) (*runtimeapi.VersionResponse, error) {
	var resp *runtimeapi.VersionResponse
	err := c.do(ctx, "version", "Version", object{}, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
	return resp, err
}

// Status returns the runtime's conditions (RuntimeReady, NetworkReady). See Readiness
// for the node's verdict.
func (c *Client) Status(ctx context.Context) (*runtimeapi.RuntimeStatus, error) {
	var resp *runtimeapi.StatusResponse
	err := c.do(ctx, "status", "Status", object{}, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.Status(ctx, &runtimeapi.StatusRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("cri Status: %w: no status", ErrInvalidResponse)
	}
	return resp.GetStatus(), nil
}

// RunPodSandbox creates and starts a pod sandbox and returns its ID. handler selects a
// runtime class ("" for the default).
func (c *Client) RunPodSandbox(ctx context.Context, cfg *runtimeapi.PodSandboxConfig, handler string) (string, error) {
	var resp *runtimeapi.RunPodSandboxResponse
	err := c.do(ctx, "run_podsandbox", "RunPodSandbox", podObject(cfg), 2*c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
		return err
	})
	if err != nil {
		return "", err
	}
	if resp.GetPodSandboxId() == "" {
		return "", fmt.Errorf("cri RunPodSandbox %s: %w: empty sandbox ID", podObject(cfg), ErrInvalidResponse)
	}
	return resp.GetPodSandboxId(), nil
}

// StopPodSandbox stops a sandbox's containers and tears its network down. Stopping a
// stopped sandbox succeeds.
func (c *Client) StopPodSandbox(ctx context.Context, id string) error {
	return c.do(ctx, "stop_podsandbox", "StopPodSandbox", sandboxObject(id), c.timeout, func(ctx context.Context) error {
		_, err := c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		return err
	})
}

// RemovePodSandbox removes a sandbox and its containers.
func (c *Client) RemovePodSandbox(ctx context.Context, id string) error {
	return c.do(ctx, "remove_podsandbox", "RemovePodSandbox", sandboxObject(id), c.timeout, func(ctx context.Context) error {
		_, err := c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		return err
	})
}

// PodSandboxStatus returns a sandbox's state and network (its IP).
func (c *Client) PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	var resp *runtimeapi.PodSandboxStatusResponse
	err := c.do(ctx, "podsandbox_status", "PodSandboxStatus", sandboxObject(id), c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("cri PodSandboxStatus %s: %w: no status", sandboxObject(id), ErrInvalidResponse)
	}
	return resp.GetStatus(), nil
}

// ListPodSandbox lists sandboxes matching filter (nil: all).
func (c *Client) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	var resp *runtimeapi.ListPodSandboxResponse
	err := c.do(ctx, "list_podsandbox", "ListPodSandbox", object{}, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
		return err
	})
	return resp.GetItems(), err
}

// CreateContainer creates a container in a sandbox and returns its ID. sandboxCfg is the
// config the sandbox was run with.
func (c *Client) CreateContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error) {
	obj := object{kind: "container", name: cfg.GetMetadata().GetName(), sandbox: sandboxID}
	var resp *runtimeapi.CreateContainerResponse
	err := c.do(ctx, "create_container", "CreateContainer", obj, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: cfg, SandboxConfig: sandboxCfg})
		return err
	})
	if err != nil {
		return "", err
	}
	if resp.GetContainerId() == "" {
		return "", fmt.Errorf("cri CreateContainer %s: %w: empty container ID", obj, ErrInvalidResponse)
	}
	return resp.GetContainerId(), nil
}

// StartContainer starts a created container.
func (c *Client) StartContainer(ctx context.Context, id string) error {
	return c.do(ctx, "start_container", "StartContainer", containerObject(id), c.timeout, func(ctx context.Context) error {
		_, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		return err
	})
}

// StopContainer stops a container, giving it grace before SIGKILL. The call's own
// deadline is CallTimeout plus grace, as the kubelet does.
func (c *Client) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	return c.do(ctx, "stop_container", "StopContainer", containerObject(id), c.timeout+grace, func(ctx context.Context) error {
		_, err := c.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: seconds(grace)})
		return err
	})
}

// UpdateContainerResources changes a running container's cgroup limits in
// place (an in-place pod resize).
func (c *Client) UpdateContainerResources(ctx context.Context, id string, resources *runtimeapi.LinuxContainerResources) error {
	return c.do(ctx, "update_container", "UpdateContainerResources", containerObject(id), c.timeout, func(ctx context.Context) error {
		_, err := c.runtime.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: resources})
		return err
	})
}

// RemoveContainer removes a container; a running one is killed first.
func (c *Client) RemoveContainer(ctx context.Context, id string) error {
	return c.do(ctx, "remove_container", "RemoveContainer", containerObject(id), c.timeout, func(ctx context.Context) error {
		_, err := c.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		return err
	})
}

// ListContainers lists containers matching filter (nil: all).
func (c *Client) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	var resp *runtimeapi.ListContainersResponse
	err := c.do(ctx, "list_containers", "ListContainers", object{}, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: filter})
		return err
	})
	return resp.GetContainers(), err
}

// ContainerStatus returns a container's state, exit code and times. containerd 1.6
// leaves ImageId empty: use ImageRef.
func (c *Client) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	var resp *runtimeapi.ContainerStatusResponse
	err := c.do(ctx, "container_status", "ContainerStatus", containerObject(id), c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("cri ContainerStatus %s: %w: no status", containerObject(id), ErrInvalidResponse)
	}
	return resp.GetStatus(), nil
}

// ExecSync runs cmd in a running container and waits for it, the shape exec probes
// need: the command's exit code comes back with a nil error whatever it is; a command
// that outlives timeout returns an error wrapping ErrTimeout; any other error means the
// command could not be run. timeout is rounded up to whole seconds (CRI's unit); 0
// means no timeout. The call's own deadline is timeout plus CallTimeout, as the
// kubelet's, so the runtime has time to clean up.
func (c *Client) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error) {
	callTimeout := time.Duration(0)
	if timeout > 0 {
		callTimeout = c.timeout + timeout
	}
	var resp *runtimeapi.ExecSyncResponse
	err = c.do(ctx, "exec_sync", "ExecSync", object{kind: "container", name: containerID, cmd: cmd}, callTimeout, func(ctx context.Context) (err error) {
		resp, err = c.runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: cmd, Timeout: seconds(timeout)})
		return err
	})
	if err != nil {
		return nil, nil, -1, err
	}
	return resp.GetStdout(), resp.GetStderr(), int(resp.GetExitCode()), nil
}

// seconds rounds d up to whole seconds, so a sub-second timeout does not become 0
// (which CRI reads as "no timeout").
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// ListImages lists images matching filter (nil: all).
func (c *Client) ListImages(ctx context.Context, filter *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	var resp *runtimeapi.ListImagesResponse
	err := c.do(ctx, "list_images", "ListImages", object{}, c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{Filter: filter})
		return err
	})
	return resp.GetImages(), err
}

// ImageStatus returns the image, or nil with a nil error when the runtime does not
// have it (CRI answers an absent image with an empty status, not NotFound).
func (c *Client) ImageStatus(ctx context.Context, image string) (*runtimeapi.Image, error) {
	var resp *runtimeapi.ImageStatusResponse
	err := c.do(ctx, "image_status", "ImageStatus", imageObject(image), c.timeout, func(ctx context.Context) (err error) {
		resp, err = c.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.GetImage(), nil
}

// ImagePresent reports whether the runtime has image.
func (c *Client) ImagePresent(ctx context.Context, image string) (bool, error) {
	img, err := c.ImageStatus(ctx, image)
	return img != nil, err
}

// PullImage pulls image with optional registry credentials and returns the image
// reference the runtime resolved (a digest or image ID). Only ctx bounds it: pulls
// can take minutes. sandboxCfg may be nil.
func (c *Client) PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error) {
	var resp *runtimeapi.PullImageResponse
	err := c.do(ctx, "pull_image", "PullImage", imageObject(image), 0, func(ctx context.Context) (err error) {
		resp, err = c.images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth, SandboxConfig: sandboxCfg})
		return err
	})
	if err != nil {
		return "", err
	}
	if resp.GetImageRef() == "" {
		return "", fmt.Errorf("cri PullImage %s: %w: empty image reference", imageObject(image), ErrInvalidResponse)
	}
	return resp.GetImageRef(), nil
}

// EnsureImage pulls image unless the runtime has it already (the kubelet's
// IfNotPresent policy) and returns the image's reference (its ID when present).
func (c *Client) EnsureImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (ref string, pulled bool, err error) {
	img, err := c.ImageStatus(ctx, image)
	if err != nil {
		return "", false, err
	}
	if img != nil {
		return img.GetId(), false, nil
	}
	ref, err = c.PullImage(ctx, image, auth, sandboxCfg)
	return ref, err == nil, err
}

// RemoveImage removes an image. Removing an absent image succeeds.
func (c *Client) RemoveImage(ctx context.Context, image string) error {
	return c.do(ctx, "remove_image", "RemoveImage", imageObject(image), c.timeout, func(ctx context.Context) error {
		_, err := c.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
		return err
	})
}
