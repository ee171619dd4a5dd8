package main_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// nodeEgress is the tests' cluster egress: kube-apiserver's connections to a node
// (the kubelet API) are dialled from inside the node's network namespace, where the
// node's InternalIP lives.
type nodeEgress struct {
	mu sync.Mutex
	ns *netns.Namespace
}

func (e *nodeEgress) set(ns *netns.Namespace) {
	e.mu.Lock()
	e.ns = ns
	e.mu.Unlock()
}

func (e *nodeEgress) dial(ctx context.Context, address string) (net.Conn, error) {
	e.mu.Lock()
	ns := e.ns
	e.mu.Unlock()
	if ns == nil {
		return nil, errors.New("no node namespace yet")
	}
	return ns.Dial(ctx, "tcp", address)
}

// runKubectl runs kubectl with kubeconfig and stdin, bounded by timeout, and returns
// its stdout, stderr and exit code.
func runKubectl(t *testing.T, kubeconfig, stdin string, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.PeerBinary(t, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("kubectl %s: timed out after %s; stdout %q stderr %q", strings.Join(args, " "), timeout, out.String(), errb.String())
	}
	return out.String(), errb.String(), code
}

// kubeletClient is an HTTPS client to the kubelet API from inside the node's
// namespace, presenting cert when not nil (the kubelet's self-signed serving
// certificate is not verified, as kube-apiserver without --kubelet-certificate-authority).
func kubeletClient(n *testNode, cert *tls.Certificate) *http.Client {
	tc := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the kubelet's self-signed certificate
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   tc,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return n.env.Node.Dial(ctx, network, address)
		},
	}}
}

func userCert(t *testing.T, cp *controlplane.ControlPlane, user string, groups ...string) *tls.Certificate {
	t.Helper()
	rc := cp.UserConfig(t, user, groups...)
	c, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
	require.NoError(t, err)
	return &c
}

func kubeletDo(t *testing.T, c *http.Client, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grant(t *testing.T, n *testNode, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	_, err := n.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-" + user}, Rules: rules,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = n.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "test-" + user},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// TestKubeletServer drives the kubelet API as operators do: the real kubectl through
// the real kube-apiserver (which reaches the kubelet inside its node namespace through
// the cluster egress) for logs, exec, attach and port-forward, and the kubelet's own
// refusals for real (x509 against the cluster CA, TokenReview and SubjectAccessReview
// against the API server).
func TestKubeletServer(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	egress := &nodeEgress{}
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: egress.dial})
	n := startNode(t, cp, "nk-api", true)
	egress.set(n.env.Node)
	image := n.ctd.BusyboxImage()
	admin := cp.AdminKubeconfig()
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)

	logs := busyboxPod("logs", image, corev1.RestartPolicyAlways,
		`echo "line 1"; echo "line 2"; echo "line 3"; while true; do if [ -f /tmp/more ]; then rm /tmp/more; echo more; fi; sleep 0.2; done`)
	n.createPod(t, logs)
	crashy := busyboxPod("crashy", image, corev1.RestartPolicyAlways,
		`n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo "attempt $n"; if [ $n -ge 2 ]; then exec sleep 3600; fi; exit 1`)
	crashy.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	crashy.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	n.createPod(t, crashy)
	web := busyboxPod("web", image, corev1.RestartPolicyAlways,
		`mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www`)
	n.createPod(t, web)
	attach := busyboxPod("attach", image, corev1.RestartPolicyNever, `while read l; do echo "got $l"; done; echo bye`)
	attach.Spec.Containers[0].Stdin, attach.Spec.Containers[0].StdinOnce = true, true
	n.createPod(t, attach)
	for _, name := range []string{"logs", "web", "attach"} {
		n.waitPod(t, name, 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	}

	t.Run("kubectl logs, --tail, --timestamps", func(t *testing.T) {
		var out string
		eventually(t, 20*time.Second, "the three lines", func() (bool, string) {
			o, e, code := runKubectl(t, admin, "", 20*time.Second, "logs", "logs")
			out = o
			return code == 0 && o == "line 1\nline 2\nline 3\n", fmt.Sprintf("code %d stdout %q stderr %q", code, o, e)
		})
		out, _, _ = runKubectl(t, admin, "", 20*time.Second, "logs", "logs", "--tail=1")
		assert.Equal(t, "line 3\n", out)
		out, _, _ = runKubectl(t, admin, "", 20*time.Second, "logs", "logs", "--timestamps", "--tail=2")
		assert.Regexp(t, regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z line 2\n\S+ line 3\n$`), out)
		out, _, _ = runKubectl(t, admin, "", 20*time.Second, "logs", "logs", "--limit-bytes=4")
		assert.Equal(t, "line", out)
		out, _, _ = runKubectl(t, admin, "", 20*time.Second, "logs", "logs", "--since=1h")
		assert.Equal(t, "line 1\nline 2\nline 3\n", out)
	})

	t.Run("kubectl logs -f follows new lines", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testenv.PeerBinary(t, "kubectl"), "--kubeconfig", admin, "logs", "-f", "logs")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		r := bufio.NewReader(stdout)
		for _, want := range []string{"line 1\n", "line 2\n", "line 3\n"} {
			line, err := r.ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, want, line)
		}
		_, e, code := runKubectl(t, admin, "", 20*time.Second, "exec", "logs", "--", "touch", "/tmp/more")
		require.Equal(t, 0, code, e)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "more\n", line, "a line written while following arrives")
	})

	t.Run("kubectl logs --previous", func(t *testing.T) {
		n.waitPod(t, "crashy", 90*time.Second, "restarted once and running", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 &&
				p.Status.ContainerStatuses[0].State.Running != nil
		})
		out, e, code := runKubectl(t, admin, "", 20*time.Second, "logs", "crashy")
		require.Equal(t, 0, code, e)
		assert.Equal(t, "attempt 2\n", out)
		out, e, code = runKubectl(t, admin, "", 20*time.Second, "logs", "crashy", "--previous")
		require.Equal(t, 0, code, e)
		assert.Equal(t, "attempt 1\n", out, "the previous container's own log file")
		_, e, code = runKubectl(t, admin, "", 20*time.Second, "logs", "logs", "--previous")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, e, `previous terminated container "main" in pod "logs" not found`)
	})

	t.Run("kubectl exec: output, exit code, -i", func(t *testing.T) {
		out, e, code := runKubectl(t, admin, "", 30*time.Second, "exec", "logs", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		assert.Equal(t, "out\n", out)
		assert.Contains(t, e, "err\n")
		assert.Equal(t, 3, code, "kubectl exits with the command's code")
		out, e, code = runKubectl(t, admin, "piped through\nstdin\n", 30*time.Second, "exec", "-i", "logs", "--", "cat")
		require.Equal(t, 0, code, e)
		assert.Equal(t, "piped through\nstdin\n", out)
		_, e, code = runKubectl(t, admin, "", 30*time.Second, "exec", "logs", "-c", "nope", "--", "true")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, e, "container nope is not valid for pod logs", "kubectl refuses an unknown container itself")
	})

	t.Run("kubectl attach -i", func(t *testing.T) {
		out, e, code := runKubectl(t, admin, "hello\n", 60*time.Second, "attach", "-i", "attach")
		require.Equal(t, 0, code, e)
		assert.Contains(t, out, "got hello\n")
		assert.Contains(t, out, "bye\n", "stdinOnce: closing stdin ends the container's read loop")
	})

	t.Run("kubectl port-forward to the pod's HTTP server", func(t *testing.T) {
		n.waitPod(t, "web", 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testenv.PeerBinary(t, "kubectl"), "--kubeconfig", admin, "port-forward", "pod/web", "0:8080")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err, "stderr: %s", stderr.String())
		m := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`).FindStringSubmatch(line)
		require.NotNil(t, m, line)
		for i := range 2 {
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://127.0.0.1:" + m[1] + "/")
			require.NoError(t, err, "request %d; kubectl stderr: %s", i, stderr.String())
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "hello-from-pod\n", string(b))
		}
	})

	nodeURL := "https://" + n.env.NodeIP.String() + ":10250"
	t.Run("stats summary and resource metrics through the node proxy, as metrics-server scrapes", func(t *testing.T) {
		raw := func(path string) string {
			out, e, code := runKubectl(t, admin, "", 30*time.Second, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy"+path)
			require.Equal(t, 0, code, "%s: %s", path, e)
			return out
		}
		var summary statsapi.Summary
		eventually(t, 30*time.Second, "the web pod in the summary with CPU and memory", func() (bool, string) {
			out := raw("/stats/summary")
			if err := json.Unmarshal([]byte(out), &summary); err != nil {
				return false, err.Error()
			}
			for _, p := range summary.Pods {
				if p.PodRef.Name == "web" && p.PodRef.Namespace == "default" && len(p.Containers) == 1 &&
					p.Containers[0].Memory != nil && p.Containers[0].Memory.WorkingSetBytes != nil && *p.Containers[0].Memory.WorkingSetBytes > 0 &&
					p.Containers[0].CPU != nil && p.Containers[0].CPU.UsageCoreNanoSeconds != nil {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d pods", len(summary.Pods))
		})
		assert.Equal(t, n.name, summary.Node.NodeName)
		require.NotNil(t, summary.Node.Memory)
		assert.Positive(t, *summary.Node.Memory.WorkingSetBytes)
		metrics := raw("/metrics/resource")
		assert.Regexp(t, `(?m)^node_cpu_usage_seconds_total \S+ \d+$`, metrics)
		assert.Regexp(t, `(?m)^container_memory_working_set_bytes\{container="main",namespace="default",pod="web"\} [1-9]\S* \d+$`, metrics)
	})

	t.Run("refusals at the kubelet: 401 without credentials, 403 from a real SubjectAccessReview", func(t *testing.T) {
		anon := kubeletClient(n, nil)
		code, body := kubeletDo(t, anon, "GET", nodeURL+"/pods", "")
		assert.Equal(t, http.StatusUnauthorized, code, "no client certificate; anonymous is off")
		assert.Equal(t, "Unauthorized", body)
		code, _ = kubeletDo(t, anon, "GET", nodeURL+"/healthz", "not-a-real-token")
		assert.Equal(t, http.StatusUnauthorized, code, "a token the TokenReview rejects")

		code, body = kubeletDo(t, kubeletClient(n, userCert(t, cp, "eve")), "GET", nodeURL+"/pods", "")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=eve, verb=get, resource=nodes, subresource(s)=[pods proxy])\n", body)

		code, body = kubeletDo(t, kubeletClient(n, userCert(t, cp, controlplane.KubeletClientUser, "system:masters")), "GET", nodeURL+"/pods", "")
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, `"kind":"PodList"`)
		assert.Contains(t, body, `"name":"logs"`)
	})

	t.Run("nodes/log opens only /logs/; nodes/proxy opens container logs and exec", func(t *testing.T) {
		grant(t, n, "log-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/log"}, Verbs: []string{"get"}})
		grant(t, n, "proxy-user", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get", "create"}})
		logReader := kubeletClient(n, userCert(t, cp, "log-reader"))
		code, _ := kubeletDo(t, logReader, "GET", nodeURL+"/logs/", "")
		assert.Equal(t, http.StatusNotFound, code, "authorized as nodes/log; the node's system logs are not served")
		code, body := kubeletDo(t, logReader, "GET", nodeURL+"/containerLogs/default/logs/main", "")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=log-reader, verb=get, resource=nodes, subresource(s)=[proxy])\n", body)
		code, body = kubeletDo(t, logReader, "POST", nodeURL+"/exec/default/logs/main?command=true&output=1", "")
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, "Forbidden (user=log-reader, verb=create, resource=nodes, subresource(s)=[proxy])\n", body)

		proxyUser := kubeletClient(n, userCert(t, cp, "proxy-user"))
		code, body = kubeletDo(t, proxyUser, "GET", nodeURL+"/containerLogs/default/logs/main?tailLines=1", "")
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "more\n", body)
		code, _ = kubeletDo(t, proxyUser, "POST", nodeURL+"/exec/default/logs/main?command=true&output=1", "")
		assert.NotEqual(t, http.StatusForbidden, code, "authorized (the request is no stream upgrade, so it fails after)")
		code, body = kubeletDo(t, proxyUser, "GET", nodeURL+"/containerLogs/default/nope/main", "")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `pod "nope" does not exist`, body)
	})

	t.Run("another node's identity: 403 from the Node authorizer and RBAC", func(t *testing.T) {
		other := kubeletClient(n, userCert(t, cp, "system:node:other", "system:nodes"))
		for _, tc := range []struct{ method, path, verb string }{
			{"POST", "/exec/default/logs/main?command=true&output=1", "create"},
			{"GET", "/exec/default/logs/main?command=true&output=1", "get"},
			{"GET", "/containerLogs/default/logs/main", "get"},
			{"POST", "/portForward/default/web", "create"},
			{"GET", "/portForward/default/web", "get"},
		} {
			code, body := kubeletDo(t, other, tc.method, nodeURL+tc.path, "")
			assert.Equal(t, http.StatusForbidden, code, "%s %s", tc.method, tc.path)
			assert.Equal(t, "Forbidden (user=system:node:other, verb="+tc.verb+", resource=nodes, subresource(s)=[proxy])\n", body, "%s %s", tc.method, tc.path)
		}
	})

	t.Run("a pod bound to another node: 404 on exec, containerLogs and portForward", func(t *testing.T) {
		away := busyboxPod("away", image, corev1.RestartPolicyNever, "true")
		away.Spec.NodeName = "elsewhere"
		_, err := n.admin.CoreV1().Pods("default").Create(context.Background(), away, metav1.CreateOptions{})
		require.NoError(t, err)
		proxyUser := kubeletClient(n, userCert(t, cp, "proxy-user"))
		for _, tc := range []struct{ method, path, body string }{
			{"POST", "/exec/default/away/main?command=true&output=1", "pod does not exist"},
			{"GET", "/containerLogs/default/away/main", `pod "away" does not exist`},
			{"POST", "/portForward/default/away", "pod does not exist"},
		} {
			code, body := kubeletDo(t, proxyUser, tc.method, nodeURL+tc.path, "")
			assert.Equal(t, http.StatusNotFound, code, "%s %s", tc.method, tc.path)
			assert.Equal(t, tc.body, body, "%s %s", tc.method, tc.path)
		}
	})

	t.Run("kubectl as a user with pods/log only: logs yes, exec no", func(t *testing.T) {
		grant(t, n, "log-viewer",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list"}})
		kc := filepath.Join(t.TempDir(), "log-viewer.kubeconfig")
		cp.WriteUserKubeconfig(t, kc, "log-viewer")
		out, e, code := runKubectl(t, kc, "", 20*time.Second, "logs", "logs", "--tail=1")
		require.Equal(t, 0, code, e)
		assert.Equal(t, "more\n", out)
		_, e, code = runKubectl(t, kc, "", 20*time.Second, "exec", "logs", "--", "true")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, e, `cannot create resource "pods/exec"`)
	})

	if t.Failed() {
		if b, err := os.ReadFile(filepath.Join(cp.Dir(), "logs", "kube-apiserver.log")); err == nil {
			s := string(b)
			if len(s) > 8000 {
				s = s[len(s)-8000:]
			}
			t.Logf("--- kube-apiserver log tail ---\n%s", s)
		}
	}
}
