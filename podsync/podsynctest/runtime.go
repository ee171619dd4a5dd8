// Package podsynctest provides an in-memory podsync.Runtime that behaves like
// containerd for the calls podsync makes, plus helpers for unit tests of code
// built on podsync.
//
// # State
//
// Sandboxes, containers and images live in maps guarded by one mutex. The
// lifecycle follows containerd's CRI plugin: a container needs a ready sandbox and
// a present image and a name (name, sandbox, attempt) not taken; StartContainer
// needs a created container; stopping a sandbox stops its containers;
// removing a sandbox removes them; Stop and Remove of a known object are idempotent
// and unknown IDs answer a gRPC NotFound. Exited containers get the reasons
// containerd writes: Completed for exit code 0, Error otherwise, OOMKilled when
// Exit says so. Times come from the Runtime's clock, so tests on a fake clock get
// exact timestamps.
//
// # Test controls
//
// Exit makes a running container exit with a code (a crash); OnStop picks the exit
// code StopContainer produces (default 137, as for a process that ignores
// SIGTERM); AddImage and SetPullable control images; FailNext queues an error for
// the next call of a method; SetExec answers ExecSync. Calls returns the calls
// made, in order.
package podsynctest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"
)

// Call is one recorded call: the method name and its main argument (an ID, an
// image or a container name).
type Call struct {
	Method string
	Arg    string
}

// String returns "Method(Arg)".
func (c Call) String() string { return c.Method + "(" + c.Arg + ")" }

// ExecFunc answers ExecSync.
type ExecFunc func(containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error)

// Runtime is an in-memory CRI runtime satisfying podsync.Runtime and
// podsync.ImagePuller. Build it with New. Safe for concurrent use.
type Runtime struct {
	clk clock.PassiveClock

	mu         sync.Mutex
	next       int
	sandboxes  map[string]*runtimeapi.PodSandboxStatus
	containers map[string]*container
	images     map[string]string // name -> ref
	pullable   map[string]bool
	failNext   map[string][]error
	calls      []Call
	exec       ExecFunc
	onStop     func(id string, grace time.Duration) int
	names      map[string]string // reserved container name -> id
}

type container struct {
	status  *runtimeapi.ContainerStatus
	sandbox string
	name    string // reserved name
}

// New returns an empty Runtime on clk (nil means the real clock).
func New(clk clock.PassiveClock) *Runtime {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Runtime{
		clk:        clk,
		sandboxes:  map[string]*runtimeapi.PodSandboxStatus{},
		containers: map[string]*container{},
		images:     map[string]string{},
		pullable:   map[string]bool{},
		failNext:   map[string][]error{},
		names:      map[string]string{},
	}
}

// ImageRef is the reference the Runtime gives image: "sha256:" and a name-derived
// hex string, stable across calls.
func ImageRef(image string) string {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(image); i++ {
		h ^= uint64(image[i])
		h *= 1099511628211
	}
	return fmt.Sprintf("sha256:%016x%016x%016x%016x", h, h^0x5555, h^0xaaaa, h^0xffff)
}

// AddImage makes images present on the node.
func (r *Runtime) AddImage(images ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, im := range images {
		r.images[im] = ImageRef(im)
	}
}

// HasImage reports whether image is present.
func (r *Runtime) HasImage(image string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.images[image]
	return ok
}

// SetPullable makes image pullable (true) or not (false): a pull of an image
// that is not pullable fails as containerd's does for a missing one.
func (r *Runtime) SetPullable(image string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pullable[image] = ok
}

// FailNext makes the next call of method (e.g. "StartContainer") fail with err.
// Errors queue up per method.
func (r *Runtime) FailNext(method string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failNext[method] = append(r.failNext[method], err)
}

// SetExec sets what ExecSync answers. The default runs nothing and exits 0.
func (r *Runtime) SetExec(f ExecFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exec = f
}

// OnStop sets the exit code a container gets when StopContainer stops it.
func (r *Runtime) OnStop(f func(id string, grace time.Duration) int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onStop = f
}

// Calls returns the calls made so far, in order.
func (r *Runtime) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

// CallNames returns the calls made so far as "Method(Arg)" strings, leaving out
// the read-only ones (List*, *Status) so tests can compare what was done.
func (r *Runtime) CallNames() []string {
	var out []string
	for _, c := range r.Calls() {
		if strings.HasPrefix(c.Method, "List") || strings.HasSuffix(c.Method, "Status") {
			continue
		}
		out = append(out, c.String())
	}
	return out
}

// ResetCalls forgets the recorded calls.
func (r *Runtime) ResetCalls() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// Exit makes a running container exit with code at the clock's now. reason ""
// picks containerd's (Completed or Error); "OOMKilled" marks an OOM kill.
func (r *Runtime) Exit(id string, code int32, reason, message string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return fmt.Errorf("container %s is not running", id)
	}
	r.exitLocked(c, code, reason, message)
	return nil
}

func (r *Runtime) exitLocked(c *container, code int32, reason, message string) {
	if reason == "" {
		reason = "Error"
		if code == 0 {
			reason = "Completed"
		}
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.status.ExitCode = code
	c.status.FinishedAt = r.clk.Now().UnixNano()
	c.status.Reason = reason
	c.status.Message = message
}

// Containers returns the statuses of every container, newest first.
func (r *Runtime) Containers() []*runtimeapi.ContainerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.ContainerStatus
	for _, c := range r.containers {
		out = append(out, proto.Clone(c.status).(*runtimeapi.ContainerStatus))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt > out[j].CreatedAt
		}
		return out[i].Id > out[j].Id
	})
	return out
}

// ContainerByName returns the newest container with that io.kubernetes.container.name
// label (or metadata name), or nil.
func (r *Runtime) ContainerByName(name string) *runtimeapi.ContainerStatus {
	for _, c := range r.Containers() {
		if c.GetLabels()["io.kubernetes.container.name"] == name || (c.GetLabels()["io.kubernetes.container.name"] == "" && c.GetMetadata().GetName() == name) {
			return c
		}
	}
	return nil
}

// Sandboxes returns the statuses of every sandbox, newest first.
func (r *Runtime) Sandboxes() []*runtimeapi.PodSandboxStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.PodSandboxStatus
	for _, s := range r.sandboxes {
		out = append(out, proto.Clone(s).(*runtimeapi.PodSandboxStatus))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt > out[j].CreatedAt
		}
		return out[i].Id > out[j].Id
	})
	return out
}

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "an error occurred when try to find %s %q: not found", kind, id)
}

// begin records a call and returns a queued error for it, if any. r.mu is held.
func (r *Runtime) begin(ctx context.Context, method, arg string) error {
	r.calls = append(r.calls, Call{Method: method, Arg: arg})
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if q := r.failNext[method]; len(q) > 0 {
		r.failNext[method] = q[1:]
		return q[0]
	}
	return nil
}

func (r *Runtime) newID() string {
	r.next++
	return fmt.Sprintf("%064x", r.next)
}

// RunPodSandbox creates a ready sandbox with an address from 10.88.0.0/16 (none
// for host-network pods).
func (r *Runtime) RunPodSandbox(ctx context.Context, cfg *runtimeapi.PodSandboxConfig, handler string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "RunPodSandbox", cfg.GetMetadata().GetName()); err != nil {
		return "", err
	}
	if cfg.GetMetadata().GetName() == "" || cfg.GetMetadata().GetUid() == "" {
		return "", status.Error(codes.InvalidArgument, "sandbox config must include metadata")
	}
	id := r.newID()
	st := &runtimeapi.PodSandboxStatus{
		Id:             id,
		Metadata:       proto.Clone(cfg.GetMetadata()).(*runtimeapi.PodSandboxMetadata),
		State:          runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt:      r.clk.Now().UnixNano(),
		Labels:         copyMap(cfg.GetLabels()),
		Annotations:    copyMap(cfg.GetAnnotations()),
		RuntimeHandler: handler,
		Network:        &runtimeapi.PodSandboxNetworkStatus{},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: proto.Clone(nsOptions(cfg)).(*runtimeapi.NamespaceOption),
		}},
	}
	if nsOptions(cfg).GetNetwork() != runtimeapi.NamespaceMode_NODE {
		st.Network.Ip = fmt.Sprintf("10.88.%d.%d", (r.next/250)%250, r.next%250+2)
	}
	r.sandboxes[id] = st
	return id, nil
}

func nsOptions(cfg *runtimeapi.PodSandboxConfig) *runtimeapi.NamespaceOption {
	if o := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions(); o != nil {
		return o
	}
	return &runtimeapi.NamespaceOption{}
}

// StopPodSandbox stops the sandbox's running containers (exit code 137) and marks
// it not ready.
func (r *Runtime) StopPodSandbox(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "StopPodSandbox", id); err != nil {
		return err
	}
	sb, ok := r.sandboxes[id]
	if !ok {
		return notFound("sandbox", id)
	}
	for _, c := range r.containers {
		if c.sandbox == id && c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			r.exitLocked(c, 137, "", "")
		}
	}
	sb.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return nil
}

// RemovePodSandbox removes the sandbox and its containers.
func (r *Runtime) RemovePodSandbox(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "RemovePodSandbox", id); err != nil {
		return err
	}
	if _, ok := r.sandboxes[id]; !ok {
		return nil // containerd: removing a missing sandbox succeeds
	}
	for cid, c := range r.containers {
		if c.sandbox == id {
			delete(r.names, c.name)
			delete(r.containers, cid)
		}
	}
	delete(r.sandboxes, id)
	return nil
}

// PodSandboxStatus returns a copy of the sandbox's status.
func (r *Runtime) PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "PodSandboxStatus", id); err != nil {
		return nil, err
	}
	sb, ok := r.sandboxes[id]
	if !ok {
		return nil, notFound("sandbox", id)
	}
	return proto.Clone(sb).(*runtimeapi.PodSandboxStatus), nil
}

// ListPodSandbox lists sandboxes matching filter.
func (r *Runtime) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "ListPodSandbox", ""); err != nil {
		return nil, err
	}
	var out []*runtimeapi.PodSandbox
	for _, sb := range r.sandboxes {
		if filter.GetId() != "" && filter.GetId() != sb.Id {
			continue
		}
		if filter.GetState() != nil && filter.GetState().GetState() != sb.State {
			continue
		}
		if !matches(sb.Labels, filter.GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.PodSandbox{
			Id: sb.Id, Metadata: proto.Clone(sb.Metadata).(*runtimeapi.PodSandboxMetadata), State: sb.State,
			CreatedAt: sb.CreatedAt, Labels: copyMap(sb.Labels), Annotations: copyMap(sb.Annotations), RuntimeHandler: sb.RuntimeHandler,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out, nil
}

// CreateContainer creates a container in a ready sandbox from a present image.
func (r *Runtime) CreateContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "CreateContainer", cfg.GetMetadata().GetName()); err != nil {
		return "", err
	}
	sb, ok := r.sandboxes[sandboxID]
	if !ok {
		return "", notFound("sandbox", sandboxID)
	}
	if sb.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return "", status.Errorf(codes.Unknown, "failed to create containerd container: sandbox %q is not running", sandboxID)
	}
	image := cfg.GetImage().GetImage()
	ref, ok := r.images[image]
	if !ok {
		// containerd resolves a reference too.
		for name, rf := range r.images {
			if rf == image {
				ref, ok, image = rf, true, name
				break
			}
		}
	}
	if !ok {
		return "", status.Errorf(codes.NotFound, "failed to get image %q: not found", cfg.GetImage().GetImage())
	}
	md := cfg.GetMetadata()
	name := fmt.Sprintf("%s_%s_%s_%s_%d", md.GetName(), sb.Metadata.GetName(), sb.Metadata.GetNamespace(), sb.Metadata.GetUid(), md.GetAttempt())
	if other, taken := r.names[name]; taken {
		return "", status.Errorf(codes.Unknown, "failed to reserve container name %q: name %q is reserved for %q", name, name, other)
	}
	id := r.newID()
	var mounts []*runtimeapi.Mount
	for _, m := range cfg.GetMounts() {
		mounts = append(mounts, proto.Clone(m).(*runtimeapi.Mount))
	}
	r.containers[id] = &container{
		sandbox: sandboxID,
		name:    name,
		status: &runtimeapi.ContainerStatus{
			Id:          id,
			Metadata:    proto.Clone(md).(*runtimeapi.ContainerMetadata),
			State:       runtimeapi.ContainerState_CONTAINER_CREATED,
			CreatedAt:   r.clk.Now().UnixNano(),
			Image:       &runtimeapi.ImageSpec{Image: image},
			ImageRef:    ref,
			ImageId:     ref,
			Labels:      copyMap(cfg.GetLabels()),
			Annotations: copyMap(cfg.GetAnnotations()),
			Mounts:      mounts,
			LogPath:     joinLogPath(sandboxCfg.GetLogDirectory(), cfg.GetLogPath()),
		},
	}
	r.names[name] = id
	return id, nil
}

func joinLogPath(dir, p string) string {
	if dir == "" || p == "" {
		return p
	}
	return strings.TrimSuffix(dir, "/") + "/" + p
}

// StartContainer starts a created container.
func (r *Runtime) StartContainer(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "StartContainer", id); err != nil {
		return err
	}
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		return status.Errorf(codes.Unknown, "container %q is in %s state", id, c.status.State)
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.status.StartedAt = r.clk.Now().UnixNano()
	return nil
}

// StopContainer stops a running container; its exit code comes from OnStop
// (default 137). Stopping a stopped container succeeds.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "StopContainer", fmt.Sprintf("%s,%s", id, grace)); err != nil {
		return err
	}
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	switch c.status.State {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		code := 137
		if r.onStop != nil {
			code = r.onStop(id, grace)
		}
		r.exitLocked(c, int32(code), "", "")
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		r.exitLocked(c, 0, "", "")
		c.status.Reason = "Completed"
	}
	return nil
}

// RemoveContainer removes a container, stopping it first when it runs.
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "RemoveContainer", id); err != nil {
		return err
	}
	c, ok := r.containers[id]
	if !ok {
		return nil
	}
	delete(r.names, c.name)
	delete(r.containers, id)
	return nil
}

// ContainerStatus returns a copy of the container's status.
func (r *Runtime) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "ContainerStatus", id); err != nil {
		return nil, err
	}
	c, ok := r.containers[id]
	if !ok {
		return nil, notFound("container", id)
	}
	return proto.Clone(c.status).(*runtimeapi.ContainerStatus), nil
}

// ListContainers lists containers matching filter.
func (r *Runtime) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "ListContainers", ""); err != nil {
		return nil, err
	}
	var out []*runtimeapi.Container
	for id, c := range r.containers {
		st := c.status
		if filter.GetId() != "" && filter.GetId() != id {
			continue
		}
		if filter.GetPodSandboxId() != "" && filter.GetPodSandboxId() != c.sandbox {
			continue
		}
		if filter.GetState() != nil && filter.GetState().GetState() != st.State {
			continue
		}
		if !matches(st.Labels, filter.GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.Container{
			Id: id, PodSandboxId: c.sandbox, Metadata: proto.Clone(st.Metadata).(*runtimeapi.ContainerMetadata),
			Image: proto.Clone(st.Image).(*runtimeapi.ImageSpec), ImageRef: st.ImageRef, ImageId: st.ImageId, State: st.State,
			CreatedAt: st.CreatedAt, Labels: copyMap(st.Labels), Annotations: copyMap(st.Annotations),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out, nil
}

// EnsureImage returns the image's reference, pulling it when absent and pullable.
func (r *Runtime) EnsureImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "EnsureImage", image); err != nil {
		return "", false, err
	}
	if ref, ok := r.images[image]; ok {
		return ref, false, nil
	}
	ref, err := r.pullLocked(image)
	return ref, err == nil, err
}

// ImageStatus returns the image, or nil with a nil error when it is absent (as
// CRI answers).
func (r *Runtime) ImageStatus(ctx context.Context, image string) (*runtimeapi.Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "ImageStatus", image); err != nil {
		return nil, err
	}
	ref, ok := r.images[image]
	if !ok {
		return nil, nil
	}
	return &runtimeapi.Image{Id: ref, RepoTags: []string{image}, Size: uint64(len(image)) * 1000}, nil
}

// PullImage pulls image if pullable (a present image is pulled again).
func (r *Runtime) PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "PullImage", image); err != nil {
		return "", err
	}
	if _, ok := r.images[image]; ok && !r.pullableSet(image) {
		return r.images[image], nil
	}
	return r.pullLocked(image)
}

func (r *Runtime) pullableSet(image string) bool {
	_, ok := r.pullable[image]
	return ok
}

func (r *Runtime) pullLocked(image string) (string, error) {
	if !r.pullable[image] {
		return "", status.Errorf(codes.NotFound, "failed to pull and unpack image %q: failed to resolve reference %q: %q: not found", image, image, image)
	}
	r.images[image] = ImageRef(image)
	return r.images[image], nil
}

// ExecSync runs the ExecFunc set with SetExec (default: exit 0, no output) in a
// running container.
func (r *Runtime) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	r.mu.Lock()
	if err := r.begin(ctx, "ExecSync", containerID+","+strings.Join(cmd, " ")); err != nil {
		r.mu.Unlock()
		return nil, nil, 0, err
	}
	c, ok := r.containers[containerID]
	if !ok {
		r.mu.Unlock()
		return nil, nil, 0, notFound("container", containerID)
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		r.mu.Unlock()
		return nil, nil, 0, status.Errorf(codes.Unknown, "container %q is not running", containerID)
	}
	f := r.exec
	r.mu.Unlock()
	if f == nil {
		return nil, nil, 0, nil
	}
	return f(containerID, cmd, timeout)
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
