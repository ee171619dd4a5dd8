// Package fakeruntime is an in-memory container runtime that serves the real CRI
// runtime/v1 gRPC API (RuntimeService and ImageService), for tests of code that talks
// CRI: the code under test dials a real socket (or a bufconn) and cannot tell the
// difference from containerd for the calls it makes.
//
// # State
//
// Sandboxes, containers and images live in maps; their lifecycle follows CRI's rules
// (Stop and Remove are idempotent where CRI says so, unknown IDs answer NotFound, a
// container needs a ready sandbox and a present image). A sandbox in the pod network
// gets an address from 10.88.0.0/16. The runtime starts Ready with the pause image
// present.
//
// # Test controls
//
// Calls are recorded (Calls, CallNames). FailNext queues errors for the next calls of
// a method; SetError makes every call of a method fail; SetDelay slows a method (a
// call honours its deadline, so client timeouts can be tested). SetCondition changes
// the runtime's Status conditions; NetworkNotReady reproduces containerd without a CNI
// config, including RunPodSandbox failing. ExecSync runs a few built-in commands (echo,
// true, false, exit N, sleep SECONDS) or a function set with SetExec.
//
// # Serving
//
// Serve listens on a unix socket; Register adds the services to a grpc.Server of your
// own (for bufconn). Stop the Server and Serve again on the same path to test a runtime
// restart: the state survives.
package fakeruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Names the fake reports and starts with.
const (
	RuntimeName    = "fakeruntime"
	RuntimeVersion = "0.1.0"
	PauseImage     = "registry.k8s.io/pause:3.10.2"
)

// Call is one recorded CRI call.
type Call struct {
	// Method is the CRI method name, e.g. "RunPodSandbox".
	Method string
	// Request is a copy of the request.
	Request proto.Message
}

// ExecFunc runs an ExecSync command. It returns the command's output and exit code;
// an error is returned to the client as is (use status.Error for a gRPC code). ctx
// ends at the command's timeout.
type ExecFunc func(ctx context.Context, containerID string, cmd []string) (stdout, stderr []byte, exitCode int32, err error)

// Runtime is the fake runtime's state. Its methods are safe for concurrent use.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	mu         sync.Mutex
	seq        int
	sandboxes  map[string]*sandbox
	containers map[string]*container
	images     map[string]*runtimeapi.Image
	calls      []Call
	next       map[string][]error
	sticky     map[string]error
	delays     map[string]time.Duration
	conditions []*runtimeapi.RuntimeCondition
	exec       ExecFunc
	auth       *runtimeapi.AuthConfig
	now        func() time.Time
}

type sandbox struct {
	status *runtimeapi.PodSandboxStatus
	config *runtimeapi.PodSandboxConfig
}

type container struct {
	status    *runtimeapi.ContainerStatus
	sandboxID string
}

// New returns a Ready runtime with the pause image.
func New() *Runtime {
	r := &Runtime{
		sandboxes:  map[string]*sandbox{},
		containers: map[string]*container{},
		images:     map[string]*runtimeapi.Image{},
		next:       map[string][]error{},
		sticky:     map[string]error{},
		delays:     map[string]time.Duration{},
		now:        time.Now,
	}
	r.conditions = []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}
	r.AddImage(PauseImage)
	return r
}

// Register adds the RuntimeService and ImageService to s.
func (r *Runtime) Register(s *grpc.Server) {
	runtimeapi.RegisterRuntimeServiceServer(s, r)
	runtimeapi.RegisterImageServiceServer(s, r)
}

// Server is a Runtime served on a listener.
type Server struct {
	grpc     *grpc.Server
	listener net.Listener
	path     string
	done     chan struct{}
}

// Serve serves r on a unix socket at path (a stale socket file is replaced).
func (r *Runtime) Serve(path string) (*Server, error) {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fakeruntime: listen on %s: %w", path, err)
	}
	s := r.ServeListener(l)
	s.path = path
	return s, nil
}

// ServeListener serves r on l until Stop.
func (r *Runtime) ServeListener(l net.Listener) *Server {
	s := &Server{grpc: grpc.NewServer(), listener: l, done: make(chan struct{})}
	r.Register(s.grpc)
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(l)
	}()
	return s
}

// Endpoint is the unix:// endpoint of a Server started by Serve.
func (s *Server) Endpoint() string { return "unix://" + s.path }

// Stop ends the server at once, closing open connections (as a runtime crash would)
// and removing the socket. It is safe to call twice.
func (s *Server) Stop() {
	s.grpc.Stop()
	<-s.done
	if s.path != "" {
		_ = os.Remove(s.path)
	}
}

// Calls returns the recorded calls in order.
func (r *Runtime) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Call(nil), r.calls...)
}

// CallNames returns the recorded calls' method names in order.
func (r *Runtime) CallNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, len(r.calls))
	for i, c := range r.calls {
		names[i] = c.Method
	}
	return names
}

// ResetCalls forgets the recorded calls.
func (r *Runtime) ResetCalls() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// FailNext makes the next len(errs) calls of method fail with errs, in order. Use
// status.Error to choose the gRPC code; a plain error reaches the client as Unknown.
func (r *Runtime) FailNext(method string, errs ...error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next[method] = append(r.next[method], errs...)
}

// SetError makes every call of method fail with err until SetError(method, nil).
func (r *Runtime) SetError(method string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.sticky, method)
		return
	}
	r.sticky[method] = err
}

// SetDelay makes every call of method wait d before it is served (0 removes it). A
// call whose deadline passes while waiting fails with DeadlineExceeded.
func (r *Runtime) SetDelay(method string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delays[method] = d
}

// SetCondition sets one of the Status conditions (RuntimeReady, NetworkReady).
func (r *Runtime) SetCondition(typ string, ok bool, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conditions {
		if c.Type == typ {
			c.Status, c.Reason, c.Message = ok, reason, message
			return
		}
	}
	r.conditions = append(r.conditions, &runtimeapi.RuntimeCondition{Type: typ, Status: ok, Reason: reason, Message: message})
}

// NetworkNotReady makes the runtime behave as containerd without a CNI config: Status
// says NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns
// error: cni plugin not initialized, and RunPodSandbox fails for pod-network sandboxes.
func (r *Runtime) NetworkNotReady() {
	r.SetCondition(runtimeapi.NetworkReady, false, "NetworkPluginNotReady", "Network plugin returns error: cni plugin not initialized")
}

// SetExec replaces the built-in ExecSync commands with f (nil restores them).
func (r *Runtime) SetExec(f ExecFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exec = f
}

// RequireAuth makes PullImage refuse requests whose credentials differ from user and
// password (nil auth included) with an Unknown "unauthorized" error.
func (r *Runtime) RequireAuth(user, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.auth = &runtimeapi.AuthConfig{Username: user, Password: password}
}

// AddImage makes image present, as if pulled.
func (r *Runtime) AddImage(image string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addImageLocked(image)
}

func (r *Runtime) addImageLocked(image string) *runtimeapi.Image {
	if img, ok := r.images[image]; ok {
		return img
	}
	sum := sha256.Sum256([]byte(image))
	img := &runtimeapi.Image{
		Id:          "sha256:" + hex.EncodeToString(sum[:]),
		RepoTags:    []string{image},
		RepoDigests: []string{repo(image) + "@sha256:" + hex.EncodeToString(sum[:])},
		Size:        uint64(1024 + len(image)),
		Spec:        &runtimeapi.ImageSpec{Image: image},
	}
	r.images[image] = img
	return img
}

func repo(image string) string {
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

// Sandboxes returns copies of every sandbox's status, sorted by creation.
func (r *Runtime) Sandboxes() []*runtimeapi.PodSandboxStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.PodSandboxStatus
	for _, s := range r.sandboxes {
		out = append(out, proto.Clone(s.status).(*runtimeapi.PodSandboxStatus))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return out
}

// Containers returns copies of every container's status, sorted by creation.
func (r *Runtime) Containers() []*runtimeapi.ContainerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.ContainerStatus
	for _, c := range r.containers {
		out = append(out, proto.Clone(c.status).(*runtimeapi.ContainerStatus))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return out
}

// enter records a call, applies its delay and injected errors.
func (r *Runtime) enter(ctx context.Context, method string, req proto.Message) error {
	r.mu.Lock()
	r.calls = append(r.calls, Call{Method: method, Request: proto.Clone(req)})
	delay := r.delays[method]
	var injected error
	if q := r.next[method]; len(q) > 0 {
		injected, r.next[method] = q[0], q[1:]
	} else if err, ok := r.sticky[method]; ok {
		injected = err
	}
	r.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
	return injected
}

// newID returns a 64-hex ID like containerd's.
func (r *Runtime) newID(kind string) string {
	r.seq++
	sum := sha256.Sum256([]byte(kind + strconv.Itoa(r.seq) + strconv.FormatInt(r.now().UnixNano(), 10)))
	return hex.EncodeToString(sum[:])
}

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "an error occurred when try to find %s %q: not found", kind, id)
}

// Version implements CRI.
func (r *Runtime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if err := r.enter(ctx, "Version", req); err != nil {
		return nil, err
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: RuntimeName, RuntimeVersion: RuntimeVersion, RuntimeApiVersion: "v1"}, nil
}

// Status implements CRI.
func (r *Runtime) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	if err := r.enter(ctx, "Status", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := &runtimeapi.RuntimeStatus{}
	for _, c := range r.conditions {
		st.Conditions = append(st.Conditions, proto.Clone(c).(*runtimeapi.RuntimeCondition))
	}
	return &runtimeapi.StatusResponse{Status: st}, nil
}

func (r *Runtime) networkReadyLocked() (bool, string) {
	for _, c := range r.conditions {
		if c.Type == runtimeapi.NetworkReady {
			return c.Status, c.Message
		}
	}
	return false, "no NetworkReady condition"
}

// RunPodSandbox implements CRI.
func (r *Runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	if err := r.enter(ctx, "RunPodSandbox", req); err != nil {
		return nil, err
	}
	cfg := req.GetConfig()
	m := cfg.GetMetadata()
	if m.GetName() == "" || m.GetNamespace() == "" || m.GetUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "sandbox config must include metadata name, namespace and uid")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	hostNetwork := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
	if ready, msg := r.networkReadyLocked(); !ready && !hostNetwork {
		return nil, status.Errorf(codes.Unknown, "failed to setup network for sandbox %q: %s", m.GetName(), strings.TrimPrefix(msg, "Network plugin returns error: "))
	}
	for _, s := range r.sandboxes {
		sm := s.status.GetMetadata()
		if sm.GetName() == m.GetName() && sm.GetNamespace() == m.GetNamespace() && sm.GetUid() == m.GetUid() && sm.GetAttempt() == m.GetAttempt() {
			return nil, status.Errorf(codes.Unknown, "failed to reserve sandbox name %q: name is reserved for %q",
				strings.Join([]string{m.GetName(), m.GetNamespace(), m.GetUid(), strconv.Itoa(int(m.GetAttempt()))}, "_"), s.status.GetId())
		}
	}
	id := r.newID("sandbox")
	st := &runtimeapi.PodSandboxStatus{
		Id:             id,
		Metadata:       proto.Clone(m).(*runtimeapi.PodSandboxMetadata),
		State:          runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt:      r.now().UnixNano(),
		Network:        &runtimeapi.PodSandboxNetworkStatus{},
		Labels:         cfg.GetLabels(),
		Annotations:    cfg.GetAnnotations(),
		RuntimeHandler: req.GetRuntimeHandler(),
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions(),
		}},
	}
	if !hostNetwork {
		st.Network.Ip = fmt.Sprintf("10.88.%d.%d", r.seq/250%250, 2+r.seq%250)
	}
	r.sandboxes[id] = &sandbox{status: st, config: proto.Clone(cfg).(*runtimeapi.PodSandboxConfig)}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// StopPodSandbox implements CRI: containers exit, the sandbox becomes NOTREADY.
func (r *Runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	if err := r.enter(ctx, "StopPodSandbox", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	for _, c := range r.containers {
		if c.sandboxID == s.status.Id {
			r.exitLocked(c, 137, "Error")
		}
	}
	s.status.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *Runtime) exitLocked(c *container, code int32, reason string) {
	if c.status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		if c.status.State == runtimeapi.ContainerState_CONTAINER_CREATED {
			c.status.State = runtimeapi.ContainerState_CONTAINER_EXITED
		}
		return
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.status.FinishedAt = r.now().UnixNano()
	c.status.ExitCode = code
	c.status.Reason = reason
}

// RemovePodSandbox implements CRI: idempotent, removes the sandbox's containers.
func (r *Runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if err := r.enter(ctx, "RemovePodSandbox", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.containers {
		if c.sandboxID == req.GetPodSandboxId() {
			delete(r.containers, id)
		}
	}
	delete(r.sandboxes, req.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// PodSandboxStatus implements CRI.
func (r *Runtime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if err := r.enter(ctx, "PodSandboxStatus", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: proto.Clone(s.status).(*runtimeapi.PodSandboxStatus)}, nil
}

func matchLabels(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// ListPodSandbox implements CRI with the id, state and label filters.
func (r *Runtime) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	if err := r.enter(ctx, "ListPodSandbox", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := req.GetFilter()
	resp := &runtimeapi.ListPodSandboxResponse{}
	for _, s := range r.sandboxes {
		st := s.status
		if f.GetId() != "" && f.GetId() != st.Id {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != st.State {
			continue
		}
		if !matchLabels(f.GetLabelSelector(), st.Labels) {
			continue
		}
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{
			Id: st.Id, Metadata: st.Metadata, State: st.State, CreatedAt: st.CreatedAt,
			Labels: st.Labels, Annotations: st.Annotations, RuntimeHandler: st.RuntimeHandler,
		})
	}
	sort.Slice(resp.Items, func(i, j int) bool { return resp.Items[i].CreatedAt < resp.Items[j].CreatedAt })
	return resp, nil
}

// CreateContainer implements CRI: the sandbox must be ready and the image present.
func (r *Runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if err := r.enter(ctx, "CreateContainer", req); err != nil {
		return nil, err
	}
	cfg := req.GetConfig()
	if cfg.GetMetadata().GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "container config must include metadata name")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	if s.status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, status.Errorf(codes.Unknown, "sandbox container %q is not running", s.status.Id)
	}
	img, ok := r.images[cfg.GetImage().GetImage()]
	if !ok {
		// The kubelet passes the image ID; accept that too.
		for _, i := range r.images {
			if i.Id == cfg.GetImage().GetImage() {
				img, ok = i, true
			}
		}
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "failed to get image %q: image not found", cfg.GetImage().GetImage())
	}
	id := r.newID("container")
	r.containers[id] = &container{sandboxID: s.status.Id, status: &runtimeapi.ContainerStatus{
		Id:          id,
		Metadata:    proto.Clone(cfg.GetMetadata()).(*runtimeapi.ContainerMetadata),
		State:       runtimeapi.ContainerState_CONTAINER_CREATED,
		CreatedAt:   r.now().UnixNano(),
		Image:       proto.Clone(cfg.GetImage()).(*runtimeapi.ImageSpec),
		ImageRef:    img.Id,
		ImageId:     img.Id,
		Labels:      cfg.GetLabels(),
		Annotations: cfg.GetAnnotations(),
		LogPath:     joinLogPath(s.config.GetLogDirectory(), cfg.GetLogPath()),
	}}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func joinLogPath(dir, path string) string {
	if dir == "" || path == "" {
		return path
	}
	return strings.TrimRight(dir, "/") + "/" + path
}

// StartContainer implements CRI: only a CREATED container starts.
func (r *Runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if err := r.enter(ctx, "StartContainer", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[req.GetContainerId()]
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if c.status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		return nil, status.Errorf(codes.Unknown, "container %q is in %s state", c.status.Id, c.status.State)
	}
	c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.status.StartedAt = r.now().UnixNano()
	return &runtimeapi.StartContainerResponse{}, nil
}

// StopContainer implements CRI: a running container exits with 137 (killed); stopping
// a stopped container succeeds.
func (r *Runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if err := r.enter(ctx, "StopContainer", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[req.GetContainerId()]
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	r.exitLocked(c, 137, "Error")
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer implements CRI: idempotent.
func (r *Runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	if err := r.enter(ctx, "RemoveContainer", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.containers, req.GetContainerId())
	return &runtimeapi.RemoveContainerResponse{}, nil
}

// ListContainers implements CRI with the id, state, sandbox and label filters.
func (r *Runtime) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	if err := r.enter(ctx, "ListContainers", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := req.GetFilter()
	resp := &runtimeapi.ListContainersResponse{}
	for _, c := range r.containers {
		st := c.status
		if f.GetId() != "" && f.GetId() != st.Id {
			continue
		}
		if f.GetPodSandboxId() != "" && f.GetPodSandboxId() != c.sandboxID {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != st.State {
			continue
		}
		if !matchLabels(f.GetLabelSelector(), st.Labels) {
			continue
		}
		resp.Containers = append(resp.Containers, &runtimeapi.Container{
			Id: st.Id, PodSandboxId: c.sandboxID, Metadata: st.Metadata, Image: st.Image, ImageRef: st.ImageRef,
			State: st.State, CreatedAt: st.CreatedAt, Labels: st.Labels, Annotations: st.Annotations, ImageId: st.ImageId,
		})
	}
	sort.Slice(resp.Containers, func(i, j int) bool { return resp.Containers[i].CreatedAt < resp.Containers[j].CreatedAt })
	return resp, nil
}

// ContainerStatus implements CRI.
func (r *Runtime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if err := r.enter(ctx, "ContainerStatus", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[req.GetContainerId()]
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: proto.Clone(c.status).(*runtimeapi.ContainerStatus)}, nil
}

// ExecSync implements CRI. The command runs under req.Timeout seconds (0: until the
// call's deadline); outliving it answers DeadlineExceeded, as containerd does.
func (r *Runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if err := r.enter(ctx, "ExecSync", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	c, ok := r.containers[req.GetContainerId()]
	var running bool
	if ok {
		running = c.status.State == runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	exec := r.exec
	r.mu.Unlock()
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if !running {
		return nil, status.Errorf(codes.Unknown, "container %q is not running", req.GetContainerId())
	}
	if exec == nil {
		exec = builtinExec
	}
	if req.GetTimeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetTimeout())*time.Second)
		defer cancel()
	}
	stdout, stderr, code, err := exec(ctx, req.GetContainerId(), req.GetCmd())
	if ctx.Err() != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "failed to exec in container: timeout %ds exceeded: %v", req.GetTimeout(), ctx.Err())
	}
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout, Stderr: stderr, ExitCode: code}, nil
}

// builtinExec runs echo, true, false, exit N and sleep SECONDS.
func builtinExec(ctx context.Context, _ string, cmd []string) ([]byte, []byte, int32, error) {
	if len(cmd) == 0 {
		return nil, nil, 0, status.Error(codes.InvalidArgument, "empty command")
	}
	switch cmd[0] {
	case "echo":
		return []byte(strings.Join(cmd[1:], " ") + "\n"), nil, 0, nil
	case "true":
		return nil, nil, 0, nil
	case "false":
		return nil, nil, 1, nil
	case "exit":
		if len(cmd) == 2 {
			if n, err := strconv.Atoi(cmd[1]); err == nil {
				return nil, nil, int32(n), nil
			}
		}
	case "sleep":
		if len(cmd) == 2 {
			if s, err := strconv.ParseFloat(cmd[1], 64); err == nil {
				t := time.NewTimer(time.Duration(s * float64(time.Second)))
				defer t.Stop()
				select {
				case <-ctx.Done():
					return nil, nil, -1, ctx.Err()
				case <-t.C:
					return nil, nil, 0, nil
				}
			}
		}
	}
	return nil, []byte(fmt.Sprintf("fakeruntime: %s: not found\n", cmd[0])), 127, nil
}

// ListImages implements CRI.
func (r *Runtime) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	if err := r.enter(ctx, "ListImages", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	resp := &runtimeapi.ListImagesResponse{}
	for name, img := range r.images {
		if f := req.GetFilter().GetImage().GetImage(); f != "" && f != name {
			continue
		}
		resp.Images = append(resp.Images, proto.Clone(img).(*runtimeapi.Image))
	}
	sort.Slice(resp.Images, func(i, j int) bool { return resp.Images[i].RepoTags[0] < resp.Images[j].RepoTags[0] })
	return resp, nil
}

// ImageStatus implements CRI: an absent image is an empty answer, not an error.
func (r *Runtime) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	if err := r.enter(ctx, "ImageStatus", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if img, ok := r.images[req.GetImage().GetImage()]; ok {
		return &runtimeapi.ImageStatusResponse{Image: proto.Clone(img).(*runtimeapi.Image)}, nil
	}
	return &runtimeapi.ImageStatusResponse{}, nil
}

// PullImage implements CRI: any well-formed name "exists" unless RequireAuth refuses it.
func (r *Runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	if err := r.enter(ctx, "PullImage", req); err != nil {
		return nil, err
	}
	name := req.GetImage().GetImage()
	if name == "" || strings.ContainsAny(name, " \t\n") || strings.ToLower(repo(name)) != repo(name) {
		return nil, status.Errorf(codes.Unknown, "failed to pull and unpack image %q: invalid reference format", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.auth != nil {
		a := req.GetAuth()
		if a.GetUsername() != r.auth.Username || a.GetPassword() != r.auth.Password {
			return nil, status.Errorf(codes.Unknown, "failed to pull and unpack image %q: failed to resolve reference %q: pulling from host failed with status code 401 Unauthorized", name, name)
		}
	}
	img := r.addImageLocked(name)
	return &runtimeapi.PullImageResponse{ImageRef: img.Id}, nil
}

// RemoveImage implements CRI: idempotent.
func (r *Runtime) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	if err := r.enter(ctx, "RemoveImage", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.images, req.GetImage().GetImage())
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo implements CRI with one filesystem whose usage is the images' size.
func (r *Runtime) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	if err := r.enter(ctx, "ImageFsInfo", req); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var used uint64
	for _, img := range r.images {
		used += img.Size
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{{
		Timestamp:  r.now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: "/var/lib/fakeruntime"},
		UsedBytes:  &runtimeapi.UInt64Value{Value: used},
		InodesUsed: &runtimeapi.UInt64Value{Value: uint64(len(r.images))},
	}}}, nil
}
