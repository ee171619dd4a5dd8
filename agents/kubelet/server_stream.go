package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/proxy"
	translator "k8s.io/apiserver/pkg/util/proxy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/klog/v2"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/nodekit-dev/nodekit/cri"
)

// execCommandParam is the query parameter carrying exec's command, one value per
// argument (api.ExecCommandParam).
const execCommandParam = "command"

// installDebuggingHandlers adds the endpoints the kubelet serves with
// enableDebuggingHandlers (the default): container logs, exec, attach,
// port-forward and run, with the kubelet's routes (a pod UID may sit before the
// container name).
func (s *kubeletServer) installDebuggingHandlers(m *http.ServeMux) {
	m.HandleFunc("/containerLogs/{namespace}/{pod}/{container}", getOnly(s.getContainerLogs))
	// Any other path under /containerLogs/ (more or fewer segments) matches none of
	// the kubelet's routes: go-restful's 404.
	m.HandleFunc("/containerLogs/", pageNotFound)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		m.HandleFunc(method+" /exec/{namespace}/{pod}/{container}", s.getExec)
		m.HandleFunc(method+" /exec/{namespace}/{pod}/{uid}/{container}", s.getExec)
		m.HandleFunc(method+" /attach/{namespace}/{pod}/{container}", s.getAttach)
		m.HandleFunc(method+" /attach/{namespace}/{pod}/{uid}/{container}", s.getAttach)
		m.HandleFunc(method+" /portForward/{namespace}/{pod}", s.getPortForward)
		m.HandleFunc(method+" /portForward/{namespace}/{pod}/{uid}", s.getPortForward)
	}
	m.HandleFunc("POST /run/{namespace}/{pod}/{container}", s.getRun)
	m.HandleFunc("POST /run/{namespace}/{pod}/{uid}/{container}", s.getRun)
}

// streamError writes a failure to reach the runtime's stream as the kubelet does
// (streaming.WriteError): NotFound is 404, ResourceExhausted 429, the rest 500.
func streamError(w http.ResponseWriter, err error) {
	_ = streaming.WriteError(err, w)
}

// notFound is a NotFound error naming what is missing.
func notFound(format string, args ...any) error {
	return grpcstatus.Error(codes.NotFound, fmt.Sprintf(format, args...))
}

// responder logs and answers a failure of the proxy to the runtime's stream server.
type responder struct{}

func (responder) Error(w http.ResponseWriter, r *http.Request, err error) {
	klog.FromContext(r.Context()).Error(err, "Error while proxying request")
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// runningContainer finds the running runtime container named container of the pod
// namespace/name, as the kubelet's findContainer (the runtime's running pods by full
// name). A missing one is a NotFound error naming it.
func (s *kubeletServer) runningContainer(ctx context.Context, pod *corev1.Pod, container string) (*runtimeapi.Container, error) {
	cs, err := s.cfg.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{
			cri.LabelPodName: pod.Name, cri.LabelPodNamespace: pod.Namespace, cri.LabelContainerName: container,
		},
	})
	if err != nil {
		return nil, err
	}
	var newest *runtimeapi.Container
	for _, c := range cs {
		if newest == nil || c.GetCreatedAt() > newest.GetCreatedAt() {
			newest = c
		}
	}
	if newest == nil {
		return nil, notFound("container not found (%q)", container)
	}
	return newest, nil
}

// streamPod looks up the pod of a streaming request; a missing pod (not on this node)
// is a 404 "pod does not exist", the kubelet's words for exec, attach, portForward and
// run (unlike containerLogs, it does not name the pod).
func (s *kubeletServer) streamPod(w http.ResponseWriter, r *http.Request) (*corev1.Pod, bool) {
	namespace, name := r.PathValue("namespace"), r.PathValue("pod")
	pod, _, ok := s.cfg.Pods.serverPod(namespace, name)
	if !ok {
		writeErrorString(w, http.StatusNotFound, "pod does not exist")
		return nil, false
	}
	return pod, true
}

// getExec serves /exec: the runtime's Exec gives a streaming URL, which the request
// is proxied to (SPDY upgrade as is; a WebSocket v5 request is translated to SPDY, as
// the kubelet does with ExtendWebSocketsToKubelet).
func (s *kubeletServer) getExec(w http.ResponseWriter, r *http.Request) {
	opts, err := remotecommandserver.NewOptions(r)
	if err != nil {
		writeErrorString(w, http.StatusBadRequest, err.Error())
		return
	}
	pod, ok := s.streamPod(w, r)
	if !ok {
		return
	}
	c, err := s.runningContainer(r.Context(), pod, r.PathValue("container"))
	if err != nil {
		streamError(w, err)
		return
	}
	resp, err := s.cfg.Runtime.RuntimeService().Exec(r.Context(), &runtimeapi.ExecRequest{
		ContainerId: c.GetId(), Cmd: r.URL.Query()[execCommandParam],
		Tty: opts.TTY, Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr,
	})
	if err != nil {
		streamError(w, err)
		return
	}
	s.proxyStream(w, r, resp.GetUrl(), opts)
}

// getAttach serves /attach like getExec, through the runtime's Attach. The TTY
// setting is the container's own (it cannot change once the process runs).
func (s *kubeletServer) getAttach(w http.ResponseWriter, r *http.Request) {
	opts, err := remotecommandserver.NewOptions(r)
	if err != nil {
		writeErrorString(w, http.StatusBadRequest, err.Error())
		return
	}
	pod, ok := s.streamPod(w, r)
	if !ok {
		return
	}
	name := r.PathValue("container")
	spec := containerSpec(pod, name)
	if spec == nil {
		streamError(w, notFound("container %s not found in pod %s", name, pod.Name+"_"+pod.Namespace))
		return
	}
	c, err := s.runningContainer(r.Context(), pod, name)
	if err != nil {
		streamError(w, notFound("container %s not found in pod %s", name, pod.Name+"_"+pod.Namespace))
		return
	}
	resp, err := s.cfg.Runtime.RuntimeService().Attach(r.Context(), &runtimeapi.AttachRequest{
		ContainerId: c.GetId(), Tty: spec.TTY, Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr,
	})
	if err != nil {
		streamError(w, err)
		return
	}
	s.proxyStream(w, r, resp.GetUrl(), opts)
}

func (s *kubeletServer) proxyStream(w http.ResponseWriter, r *http.Request, rawURL string, opts *remotecommandserver.Options) {
	u, err := url.Parse(rawURL)
	if err != nil {
		streamError(w, err)
		return
	}
	var h http.Handler = proxy.NewUpgradeAwareHandler(u, nil, false, true, responder{})
	if wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
		h = translator.NewStreamTranslatorHandler(u, nil, 0, translator.Options{
			Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr, Tty: opts.TTY,
		})
	}
	h.ServeHTTP(w, r)
}

// getPortForward serves /portForward: the runtime's PortForward for the pod's newest
// sandbox gives the streaming URL; SPDY is proxied as is and a WebSocket request
// with the tunneling protocol is tunneled, as the kubelet does.
func (s *kubeletServer) getPortForward(w http.ResponseWriter, r *http.Request) {
	tunnel := wsstream.IsWebSocketRequestWithTunnelingProtocol(r)
	opts := &portforward.V4Options{}
	if !tunnel {
		var err error
		if opts, err = portforward.NewV4Options(r); err != nil {
			writeErrorString(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	pod, ok := s.streamPod(w, r)
	if !ok {
		return
	}
	if uid := r.PathValue("uid"); uid != "" && string(pod.UID) != uid {
		writeErrorString(w, http.StatusNotFound, "pod not found")
		return
	}
	sbs, err := s.cfg.Runtime.ListPodSandbox(r.Context(), &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{cri.LabelPodUID: string(pod.UID)},
	})
	if err != nil {
		streamError(w, err)
		return
	}
	var newest *runtimeapi.PodSandbox
	for _, sb := range sbs {
		if newest == nil || sb.GetCreatedAt() > newest.GetCreatedAt() {
			newest = sb
		}
	}
	if newest == nil {
		streamError(w, notFound("pod not found (%q)", pod.Name+"_"+pod.Namespace))
		return
	}
	resp, err := s.cfg.Runtime.RuntimeService().PortForward(r.Context(), &runtimeapi.PortForwardRequest{
		PodSandboxId: newest.GetId(), Port: opts.Ports,
	})
	if err != nil {
		streamError(w, err)
		return
	}
	u, err := url.Parse(resp.GetUrl())
	if err != nil {
		streamError(w, err)
		return
	}
	var h http.Handler = proxy.NewUpgradeAwareHandler(u, nil, false, true, responder{})
	if tunnel {
		h = translator.NewTunnelingHandler(h)
	}
	h.ServeHTTP(w, r)
}

// getRun serves POST /run: the command (query parameter cmd, split on spaces) runs
// through ExecSync and its stdout then stderr are the answer; a non-zero exit is a
// 500 with the kubelet's "command '...' exited with N: stderr".
func (s *kubeletServer) getRun(w http.ResponseWriter, r *http.Request) {
	pod, ok := s.streamPod(w, r)
	if !ok {
		return
	}
	name := r.PathValue("container")
	c, err := s.runningContainer(r.Context(), pod, name)
	if err != nil {
		// Upstream's RunInContainer error, written by getRun as a 500.
		writeErrorString(w, http.StatusInternalServerError, grpcstatus.Convert(err).Message())
		return
	}
	cmd := strings.Split(r.URL.Query().Get("cmd"), " ")
	stdout, stderr, code, err := s.cfg.Runtime.ExecSync(r.Context(), c.GetId(), cmd, 0)
	if err != nil {
		writeErrorString(w, http.StatusInternalServerError, err.Error())
		return
	}
	if code != 0 {
		writeErrorString(w, http.StatusInternalServerError, fmt.Sprintf("command '%s' exited with %d: %s", strings.Join(cmd, " "), code, stderr))
		return
	}
	writeJSON(w, append(stdout, stderr...))
}
