package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

const testNodeName = "nk-node"

// fakePods is serverPods from a fixed set.
type fakePods struct {
	mu       sync.Mutex
	pods     []*corev1.Pod
	statuses map[types.UID]*corev1.PodStatus
	static   map[types.UID]bool
}

func (f *fakePods) add(p *corev1.Pod, st *corev1.PodStatus, static bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statuses == nil {
		f.statuses, f.static = map[types.UID]*corev1.PodStatus{}, map[types.UID]bool{}
	}
	f.pods = append(f.pods, p)
	f.statuses[p.UID] = st
	f.static[p.UID] = static
}

func (f *fakePods) serverPodList() []*corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range f.pods {
		if f.static[p.UID] && f.statuses[p.UID] != nil {
			p = p.DeepCopy()
			p.Status = *f.statuses[p.UID]
		}
		out = append(out, p)
	}
	return out
}

func (f *fakePods) serverPod(namespace, name string) (*corev1.Pod, *corev1.PodStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pods {
		if p.Namespace == namespace && p.Name == name {
			return p, f.statuses[p.UID], true
		}
	}
	return nil, nil, false
}

// headerAuthn authenticates the user named in X-Test-User (groups in X-Test-Groups);
// X-Test-Authn-Error makes it fail.
type headerAuthn struct{}

func (headerAuthn) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	if msg := r.Header.Get("X-Test-Authn-Error"); msg != "" {
		return nil, false, errors.New(msg)
	}
	name := r.Header.Get("X-Test-User")
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		name = token // client-go's clients (exec, port-forward) send the user as a token
	}
	if name == "" {
		return nil, false, nil
	}
	var groups []string
	if g := r.Header.Get("X-Test-Groups"); g != "" {
		groups = strings.Split(g, ",")
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: name, Groups: groups}}, true, nil
}

// grantAuthz allows a user the subresources granted to it and records every check.
type grantAuthz struct {
	mu     sync.Mutex
	grants map[string][]string // user -> "verb subresource"
	fail   map[string]bool     // user -> authorizer error
	seen   []authorizer.Attributes
}

func (g *grantAuthz) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen = append(g.seen, a)
	if g.fail[a.GetUser().GetName()] {
		return authorizer.DecisionNoOpinion, "", errors.New("webhook unreachable")
	}
	for _, grant := range g.grants[a.GetUser().GetName()] {
		if grant == a.GetVerb()+" "+a.GetSubresource() || grant == "* "+a.GetSubresource() || grant == "* *" {
			return authorizer.DecisionAllow, "", nil
		}
	}
	return authorizer.DecisionNoOpinion, "", nil
}

func (g *grantAuthz) checks() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, a := range g.seen {
		out = append(out, fmt.Sprintf("%s %s %s/%s %s", a.GetUser().GetName(), a.GetVerb(), a.GetResource(), a.GetSubresource(), a.GetName()))
	}
	return out
}

// streamRuntime is the fake runtime plus the streaming calls it lacks: Exec, Attach
// and PortForward answer with URLs of an in-process CRI streaming server.
type streamRuntime struct {
	*fakeruntime.Runtime
	stream *fakeStreams
}

func (s *streamRuntime) Exec(_ context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return s.stream.server.GetExec(req)
}

func (s *streamRuntime) Attach(_ context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return s.stream.server.GetAttach(req)
}

func (s *streamRuntime) PortForward(_ context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return s.stream.server.GetPortForward(req)
}

// serverFixture is a kubelet API server over httptest with a fake runtime, a fake
// authenticator and a grant-based authorizer.
type serverFixture struct {
	t       *testing.T
	rt      *streamRuntime
	client  *cri.Client
	pods    *fakePods
	authz   *grantAuthz
	cfg     *kubeletv1beta1.KubeletConfiguration
	server  *kubeletServer
	http    *httptest.Server
	logsDir string
}

func newServerFixture(t *testing.T, mutate func(*ServerConfig)) *serverFixture {
	t.Helper()
	f := &serverFixture{t: t, pods: &fakePods{}, authz: &grantAuthz{grants: map[string][]string{
		"admin": {"* *"},
	}, fail: map[string]bool{}}}
	f.rt = &streamRuntime{Runtime: fakeruntime.New(), stream: newFakeStreams(t)}
	f.rt.AddImage("busybox:latest")
	dir, err := os.MkdirTemp("", "nk-srv-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	f.logsDir = filepath.Join(dir, "logs")
	sock := filepath.Join(dir, "cri.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	gs := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(gs, f.rt)
	runtimeapi.RegisterImageServiceServer(gs, f.rt.Runtime)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	c, err := cri.New(context.Background(), cri.Config{Endpoint: "unix://" + sock})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	f.client = c

	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	f.cfg = cfg
	sc := ServerConfig{
		NodeName: testNodeName, Hostname: testNodeName, CertDir: filepath.Join(dir, "pki"), Config: cfg,
		Pods: f.pods, Runtime: c,
		Health: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		auth:   &serverAuth{authn: headerAuthn{}, authz: f.authz},
	}
	if mutate != nil {
		mutate(&sc)
	}
	s, err := newKubeletServer(sc)
	require.NoError(t, err)
	f.server = s
	f.http = httptest.NewServer(s.Handler())
	t.Cleanup(f.http.Close)
	return f
}

// do sends method path as user ("" for nobody) and returns status and body.
func (f *serverFixture) do(method, path, asUser string) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, nil)
	require.NoError(f.t, err)
	if asUser != "" {
		req.Header.Set("X-Test-User", asUser)
	}
	resp, err := f.http.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(b)
}

// runPod creates a sandbox and one running container per name in the fake runtime,
// registers the pod and returns it with its status (container IDs filled).
func (f *serverFixture) runPod(name string, static bool, containers ...string) (*corev1.Pod, *corev1.PodStatus) {
	f.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
	}
	for _, c := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c, Image: "busybox:latest"})
	}
	ctx := context.Background()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: f.logsDir})
	require.NoError(f.t, err)
	sb, err := f.client.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(f.t, err)
	st := &corev1.PodStatus{Phase: corev1.PodRunning}
	for _, c := range containers {
		id := f.startContainer(pod, sb, sbCfg, c, 0)
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: c, ContainerID: "fakeruntime://" + id,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		})
	}
	f.pods.add(pod, st, static)
	return pod, st
}

func (f *serverFixture) startContainer(pod *corev1.Pod, sandboxID string, sbCfg *runtimeapi.PodSandboxConfig, name string, restart int) string {
	f.t.Helper()
	ctx := context.Background()
	cc, err := cri.ContainerConfig(pod, name, restart, "")
	require.NoError(f.t, err)
	require.NoError(f.t, os.MkdirAll(filepath.Join(sbCfg.LogDirectory, name), 0o755))
	id, err := f.client.CreateContainer(ctx, sandboxID, cc, sbCfg)
	require.NoError(f.t, err)
	require.NoError(f.t, f.client.StartContainer(ctx, id))
	return id
}

func TestServerAttributes(t *testing.T) {
	u := &user.DefaultInfo{Name: "alice"}
	for _, tc := range []struct {
		method, path string
		verb         string
		subresources []string
	}{
		{"GET", "/pods", "get", []string{"pods", "proxy"}},
		{"GET", "/pods/", "get", []string{"pods", "proxy"}},
		{"GET", "/podsfoo", "get", []string{"proxy"}},
		{"GET", "/allocatedPods", "get", []string{"pods", "proxy"}},
		{"GET", "/runningpods/", "get", []string{"pods", "proxy"}},
		{"GET", "/healthz", "get", []string{"healthz", "proxy"}},
		{"GET", "/healthz/syncloop", "get", []string{"healthz", "proxy"}},
		{"GET", "/configz", "get", []string{"configz", "proxy"}},
		{"GET", "/flagz", "get", []string{"configz"}},
		{"GET", "/statusz", "get", []string{"statusz"}},
		{"GET", "/stats/summary", "get", []string{"stats"}},
		{"GET", "/stats", "get", []string{"stats"}},
		{"GET", "/metrics", "get", []string{"metrics"}},
		{"GET", "/metrics/resource", "get", []string{"metrics"}},
		{"GET", "/metrics/cadvisor", "get", []string{"metrics"}},
		{"GET", "/logs/syslog", "get", []string{"log"}},
		{"POST", "/checkpoint/default/web/main", "create", []string{"checkpoint"}},
		{"GET", "/containerLogs/default/web/main", "get", []string{"proxy"}},
		{"POST", "/exec/default/web/main", "create", []string{"proxy"}},
		{"GET", "/exec/default/web/main", "get", []string{"proxy"}},
		{"POST", "/attach/default/web/main", "create", []string{"proxy"}},
		{"POST", "/portForward/default/web", "create", []string{"proxy"}},
		{"POST", "/run/default/web/main", "create", []string{"proxy"}},
		{"PUT", "/debug/flags/v", "update", []string{"proxy"}},
		{"PATCH", "/x", "patch", []string{"proxy"}},
		{"DELETE", "/x", "delete", []string{"proxy"}},
		{"OPTIONS", "/x", "", []string{"proxy"}},
		{"HEAD", "/pods", "", []string{"pods", "proxy"}},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			attrs := requestAttributes(testNodeName, u, r)
			var subs []string
			for _, a := range attrs {
				subs = append(subs, a.GetSubresource())
				assert.Equal(t, tc.verb, a.GetVerb())
				assert.Equal(t, "nodes", a.GetResource())
				assert.Equal(t, testNodeName, a.GetName())
				assert.Equal(t, "v1", a.GetAPIVersion())
				assert.Empty(t, a.GetAPIGroup())
				assert.Empty(t, a.GetNamespace())
				assert.True(t, a.IsResourceRequest())
				assert.Equal(t, tc.path, a.GetPath())
				assert.Equal(t, "alice", a.GetUser().GetName())
			}
			assert.Equal(t, tc.subresources, subs)
		})
	}
}

func TestServerRefusals(t *testing.T) {
	f := newServerFixture(t, nil)
	f.authz.grants["pods-only"] = []string{"get pods"}
	f.authz.grants["proxy-only"] = []string{"get proxy"}
	f.authz.grants["log-only"] = []string{"get log"}
	f.authz.fail["broken"] = true

	t.Run("nobody: 401 on every path", func(t *testing.T) {
		for _, p := range []string{"/pods", "/healthz", "/metrics", "/configz", "/containerLogs/default/web/main", "/no-such-path"} {
			code, body := f.do("GET", p, "")
			assert.Equal(t, http.StatusUnauthorized, code, p)
			assert.Equal(t, "Unauthorized", body, p)
		}
	})
	t.Run("authenticator error: 401", func(t *testing.T) {
		req, _ := http.NewRequest("GET", f.http.URL+"/pods", nil)
		req.Header.Set("X-Test-Authn-Error", "token review failed")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	})
	t.Run("denied: 403 naming user, verb, resource and subresources", func(t *testing.T) {
		code, body := f.do("GET", "/pods", "mallory")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=mallory, verb=get, resource=nodes, subresource(s)=[pods proxy])\n", body)
		code, body = f.do("POST", "/exec/default/web/main?command=ls&output=1", "mallory")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=mallory, verb=create, resource=nodes, subresource(s)=[proxy])\n", body)
		code, body = f.do("GET", "/metrics", "mallory")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=mallory, verb=get, resource=nodes, subresource(s)=[metrics])\n", body)
		code, body = f.do("GET", "/configz", "log-only")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=log-only, verb=get, resource=nodes, subresource(s)=[configz proxy])\n", body)
	})
	t.Run("fine-grained first, proxy as fallback", func(t *testing.T) {
		code, _ := f.do("GET", "/pods", "pods-only")
		assert.Equal(t, http.StatusOK, code)
		code, _ = f.do("GET", "/pods", "proxy-only")
		assert.Equal(t, http.StatusOK, code)
		code, _ = f.do("GET", "/healthz", "proxy-only")
		assert.Equal(t, http.StatusOK, code)
		// nodes/proxy does not open /metrics: its subresource is metrics alone.
		code, _ = f.do("GET", "/metrics", "proxy-only")
		assert.Equal(t, http.StatusForbidden, code)
		code, _ = f.do("GET", "/healthz", "pods-only")
		assert.Equal(t, http.StatusForbidden, code)
	})
	t.Run("authorizer error: 500", func(t *testing.T) {
		code, body := f.do("GET", "/pods", "broken")
		assert.Equal(t, http.StatusInternalServerError, code)
		assert.Equal(t, "Authorization error (user=broken, verb=get, resource=nodes, subresource=pods)", body)
	})
	assert.Contains(t, f.authz.checks(), "pods-only get nodes/pods nk-node")
	assert.Contains(t, f.authz.checks(), "proxy-only get nodes/proxy nk-node")
}

func TestServerEndpoints(t *testing.T) {
	registerMetrics()
	stats := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "stats "+r.URL.Path) })
	resource := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "resource metrics") })
	f := newServerFixture(t, func(c *ServerConfig) { c.Stats, c.ResourceMetrics = stats, resource })
	web, _ := f.runPod("web", false, "main")
	_, staticStatus := f.runPod("static-web-nk-node", true, "main")
	staticStatus.Message = "computed by the kubelet"

	t.Run("/healthz", func(t *testing.T) {
		code, body := f.do("GET", "/healthz", "admin")
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "ok", body)
	})
	t.Run("/pods is a v1 PodList", func(t *testing.T) {
		code, body := f.do("GET", "/pods", "admin")
		require.Equal(t, http.StatusOK, code, body)
		var list corev1.PodList
		require.NoError(t, json.Unmarshal([]byte(body), &list))
		assert.Equal(t, "PodList", list.Kind)
		assert.Equal(t, "v1", list.APIVersion)
		require.Len(t, list.Items, 2)
		names := []string{list.Items[0].Name, list.Items[1].Name}
		sort.Strings(names)
		assert.Equal(t, []string{"static-web-nk-node", "web"}, names)
		for _, p := range list.Items {
			if p.Name == "static-web-nk-node" {
				assert.Equal(t, "computed by the kubelet", p.Status.Message, "a static pod carries the kubelet's status")
			} else {
				assert.Equal(t, web.UID, p.UID)
			}
		}
		code, body = f.do("POST", "/pods", "admin")
		assert.Equal(t, http.StatusMethodNotAllowed, code)
		assert.Equal(t, "Method Not Allowed", body)
	})
	t.Run("/configz", func(t *testing.T) {
		code, body := f.do("GET", "/configz", "admin")
		require.Equal(t, http.StatusOK, code)
		var got map[string]map[string]any
		require.NoError(t, json.Unmarshal([]byte(body), &got))
		require.Contains(t, got, "kubeletconfig")
		kc := got["kubeletconfig"]
		assert.Equal(t, "KubeletConfiguration", kc["kind"])
		assert.Equal(t, "kubelet.config.k8s.io/v1beta1", kc["apiVersion"])
		assert.Equal(t, float64(10250), kc["port"])
		assert.Equal(t, "Webhook", kc["authorization"].(map[string]any)["mode"])
	})
	t.Run("/metrics", func(t *testing.T) {
		code, body := f.do("GET", "/metrics", "admin")
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, "kubelet_running_pods")
	})
	t.Run("stats and resource metrics hooks, authorized as stats and metrics", func(t *testing.T) {
		f.authz.grants["stats-only"] = []string{"get stats"}
		f.authz.grants["metrics-only"] = []string{"get metrics"}
		code, body := f.do("GET", "/stats/summary", "stats-only")
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "stats /stats/summary", body)
		code, _ = f.do("GET", "/metrics/resource", "stats-only")
		assert.Equal(t, http.StatusForbidden, code)
		code, body = f.do("GET", "/metrics/resource", "metrics-only")
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "resource metrics", body)
	})
	t.Run("unknown path: 404 once authorized", func(t *testing.T) {
		code, _ := f.do("GET", "/no-such-path", "admin")
		assert.Equal(t, http.StatusNotFound, code)
	})
}

func TestServerHooksUnsetAndDebuggingDisabled(t *testing.T) {
	f := newServerFixture(t, func(c *ServerConfig) {
		c.Config = c.Config.DeepCopy()
		c.Config.EnableDebuggingHandlers = new(bool)
	})
	for _, p := range []string{"/stats/summary", "/metrics/resource"} {
		code, _ := f.do("GET", p, "admin")
		assert.Equal(t, http.StatusNotFound, code, "%s is mounted only with its handler", p)
	}
	for _, p := range []string{"/containerLogs/default/web/main", "/exec/default/web/main", "/run/default/web/main", "/portForward/default/web", "/attach/default/web/main"} {
		code, body := f.do("POST", p, "admin")
		assert.Equal(t, http.StatusMethodNotAllowed, code, p)
		assert.Equal(t, "Debug endpoints are disabled.\n", body, p)
	}
	code, _ := f.do("GET", "/pods", "admin")
	assert.Equal(t, http.StatusOK, code)
}

func TestServerStartServesTLS(t *testing.T) {
	f := newServerFixture(t, func(c *ServerConfig) {
		c.Config = c.Config.DeepCopy()
		c.Config.Address = "127.0.0.1"
		c.Config.Port = 0
	})
	// Port 0 is the validated default elsewhere; here it asks for any free port.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := f.server.Start(ctx)
	require.NoError(t, err)
	defer f.server.Close()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: insecureTLS()}}
	req, _ := http.NewRequest("GET", "https://"+addr.String()+"/healthz", nil)
	req.Header.Set("X-Test-User", "admin")
	resp, err := hc.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "ok", string(b))
	require.NotNil(t, resp.TLS)
	assert.Equal(t, testNodeName, resp.TLS.PeerCertificates[0].Subject.CommonName[:len(testNodeName)])
	_, err = os.Stat(filepath.Join(f.server.cfg.CertDir, "kubelet.crt"))
	assert.NoError(t, err)
}

func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // test client
