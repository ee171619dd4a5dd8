package main_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	streamspdy "k8s.io/streaming/pkg/httpstream/spdy"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// kernelTunables are the global sysctls the upstream kubelet sets at start
// (setupKernelTunables) unless --protect-kernel-defaults, which refuses to start
// when they differ. The peer runs in a mount namespace of its own where each is a
// regular file holding the machine's value, so the machine's kernel is never changed.
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func readTunables(t testing.TB) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range kernelTunables {
		b, err := os.ReadFile("/proc/sys/" + k)
		require.NoError(t, err)
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// addrEgress dials kube-apiserver's connections to a kubelet from the namespace that
// holds the node's address: each node has its own external /24.
type addrEgress struct {
	mu sync.Mutex
	ns map[string]*netns.Namespace
}

func (e *addrEgress) add(ip string, ns *netns.Namespace) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ns == nil {
		e.ns = map[string]*netns.Namespace{}
	}
	e.ns[ip] = ns
}

func (e *addrEgress) dial(ctx context.Context, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	ns := e.ns[host]
	e.mu.Unlock()
	if ns == nil {
		return nil, fmt.Errorf("no node namespace holds %s", host)
	}
	return ns.Dial(ctx, "tcp", address)
}

// startBenchNode is startNode for the benchmark: the node's external /24 is extCIDR
// (two nodes never share an address), logs are not rotated below 200 MiB, and with
// upstream the node runs the upstream kubelet peer instead of the agent.
func startBenchNode(t testing.TB, cp *controlplane.ControlPlane, egress *addrEgress, name, extCIDR string, upstream bool) *testNode {
	t.Helper()
	n := &testNode{name: name, cp: cp, admin: cp.AdminClient()}
	n.env = netns.New(t, netns.Config{Pods: 1, ExternalCIDR: extCIDR})
	egress.add(n.env.NodeIP.String(), n.env.Node)
	n.cgroupRoot = makeCgroupRoot(t, name)
	n.ctd = containerd.Start(t, containerd.Options{CNI: true, NetNS: n.env.Node.Path()})
	fwd := n.env.Node.Forward(t, strings.TrimPrefix(cp.URL(), "https://"))
	dir, err := os.MkdirTemp("", "nk-bench-")
	require.NoError(t, err)
	t.Cleanup(func() {
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	n.dir = dir
	n.apiURL = "https://" + fwd
	cp.WriteNodeKubeconfig(t, filepath.Join(dir, "kubeconfig"), name, n.apiURL)
	cfg := nodeConfig + fmt.Sprintf("podLogsDir: %s\nstaticPodPath: %s\ncgroupRoot: %s\ncontainerLogMaxSize: 200Mi\nauthentication:\n  x509:\n    clientCAFile: %s\n",
		filepath.Join(dir, "logs"), filepath.Join(dir, "manifests"), n.cgroupRoot, cp.CAFile())
	if upstream {
		// Image garbage collection off: this machine's disk is over the kubelet's
		// default 85% high threshold, and containerd 1.6 does not mark the sandbox
		// image pinned, so the peer removed the pause image between two rounds.
		cfg += "failSwapOn: false\nfailCgroupV1: false\ncgroupDriver: cgroupfs\nevictionHard:\n  memory.available: 1Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n" +
			"imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n"
	}
	cfg = withTestEvictionHard(cfg)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "manifests"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600))
	bin := kubeletBin
	if upstream {
		bin = testenv.PeerBinary(t, "kubelet")
	}
	coldStart(t, bin)
	kargs := []string{
		"--net=" + n.env.Node.Path(), bin,
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--kubeconfig=" + filepath.Join(dir, "kubeconfig"),
		"--hostname-override=" + name,
		"--node-ip=" + n.env.NodeIP.String(),
		"--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "root", "pki"),
		"--container-runtime-endpoint=" + n.ctd.Endpoint(),
		"-v=" + verbosity(),
	}
	var p *testenv.Process
	if upstream {
		// A private mount namespace where each tunable is bind-mounted over by a
		// regular file holding the machine's value; then nsenter into the node's net.
		sysDir := filepath.Join(dir, "sysctl")
		require.NoError(t, os.MkdirAll(sysDir, 0o755))
		script := "set -e\nmount --make-rprivate /\n"
		for _, k := range kernelTunables {
			f := filepath.Join(sysDir, strings.ReplaceAll(k, "/", "_"))
			script += fmt.Sprintf("cat /proc/sys/%s > %s\nmount --bind %s /proc/sys/%s\n", k, f, f, k)
		}
		script += `exec "$@"` + "\n"
		args := append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh", testenv.LookPath(t, "nsenter")}, kargs...)
		p, err = testenv.StartProcess("kubelet-upstream", filepath.Join(dir, "kubelet.log"), nil, testenv.LookPath(t, "unshare"), args...)
	} else {
		// NODEKIT_BENCH_NODEKIT_ENV adds to nodekit's kubelet's environment only
		// (say "GOGC=100 GODEBUG=gctrace=1"), to compare runtime settings.
		env := strings.Fields(os.Getenv("NODEKIT_BENCH_NODEKIT_ENV"))
		p, err = testenv.StartProcess("kubelet", filepath.Join(dir, "kubelet.log"), env, testenv.LookPath(t, "nsenter"), kargs...)
	}
	require.NoError(t, err)
	n.kubelet = p
	t.Cleanup(func() {
		n.kubelet.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("--- %s log tail ---\n%s", name, n.kubelet.Tail(6000))
		}
	})
	return n
}

const benchLogBytes = 100 << 20

// TestKubeletAPIBench (NODEKIT_BENCH_KUBELET_API=1) puts the agent and the upstream
// kubelet side by side on one control plane: `kubectl logs` of a 100 MiB log and
// `kubectl exec -- true` round trips through kube-apiserver, then the same log and
// exec straight from each kubelet's API, alternating nodes.
func TestKubeletAPIBench(t *testing.T) {
	if os.Getenv("NODEKIT_BENCH_KUBELET_API") != "1" {
		t.Skip("set NODEKIT_BENCH_KUBELET_API=1 to run the kubelet API benchmark")
	}
	testenv.RequireRoot(t)
	before := readTunables(t)
	t.Cleanup(func() {
		after := readTunables(t)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("the machine's %s changed: %s -> %s", k, v, after[k])
			}
		}
		t.Logf("kernel tunables unchanged: %v", after)
	})
	egress := &addrEgress{}
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: egress.dial})
	nodes := []*testNode{
		startBenchNode(t, cp, egress, "nodekit", "192.0.2.0/24", false),
		startBenchNode(t, cp, egress, "upstream", "198.51.100.0/24", true),
	}
	admin := cp.AdminKubeconfig()
	script := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' 'x' | fold -w 100; echo; echo done; exec sleep 3600`, benchLogBytes)
	for _, n := range nodes {
		select {
		case <-n.kubelet.Exited():
			t.Fatalf("the %s kubelet exited:\n%s", n.name, n.kubelet.Tail(4000))
		default:
		}
		n.waitReady(t, corev1.ConditionTrue, 120*time.Second)
		n.createPod(t, busyboxPod("big-"+n.name, n.ctd.BusyboxImage(), corev1.RestartPolicyNever, script))
	}
	for _, n := range nodes {
		n.waitPod(t, "big-"+n.name, 120*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		// The log is complete when its last line is "done".
		eventually(t, 180*time.Second, "the 100 MiB log of "+n.name, func() (bool, string) {
			o, e, code := runKubectl(t, admin, "", 30*time.Second, "logs", "big-"+n.name, "--tail=1")
			return code == 0 && o == "done\n", fmt.Sprintf("code %d out %q err %q", code, o, e)
		})
	}
	// The peer's writes landed in its own files: overcommit_memory there is the 1 it
	// sets (the machine's stays as it was, checked at cleanup).
	peerSet := map[string]string{}
	for _, k := range kernelTunables {
		b, err := os.ReadFile(filepath.Join(nodes[1].dir, "sysctl", strings.ReplaceAll(k, "/", "_")))
		require.NoError(t, err)
		peerSet[k] = strings.TrimSpace(string(b))
	}
	t.Logf("the upstream kubelet's view of the kernel tunables: %v", peerSet)
	require.Equal(t, "1", peerSet["vm/overcommit_memory"], "the upstream kubelet set vm.overcommit_memory in its own file")
	kubectlBin := testenv.PeerBinary(t, "kubectl")

	const logRuns = 5
	rate := map[string][]float64{}
	for i := 0; i < logRuns; i++ {
		for _, n := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			cmd := exec.CommandContext(ctx, kubectlBin, "--kubeconfig", admin, "logs", "big-"+n.name)
			cw := &countWriter{}
			cmd.Stdout = cw
			start := time.Now()
			err := cmd.Run()
			d := time.Since(start)
			cancel()
			require.NoError(t, err, "kubectl logs big-%s", n.name)
			// 100 MiB of x in lines of 100, then "done\n".
			want := int64(benchLogBytes + benchLogBytes/100 + 5)
			require.Equal(t, want, cw.n, "bytes of kubectl logs big-%s", n.name)
			rate[n.name] = append(rate[n.name], float64(cw.n)/(1<<20)/d.Seconds())
		}
	}
	// The same log read straight from each kubelet's API inside its namespace, as
	// kube-apiserver's kubelet client: the kubelet's share apart from the proxy and kubectl.
	cert := userCert(t, cp, controlplane.KubeletClientUser, "system:masters")
	direct := map[string][]float64{}
	for i := 0; i < logRuns; i++ {
		for _, n := range nodes {
			c := kubeletClient(n, cert)
			c.Timeout = 120 * time.Second
			start := time.Now()
			resp, err := c.Get(fmt.Sprintf("https://%s:10250/containerLogs/default/big-%s/main", n.env.NodeIP, n.name))
			require.NoError(t, err)
			got, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			d := time.Since(start)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, int64(benchLogBytes+benchLogBytes/100+5), got, "bytes of big-%s's log from its kubelet", n.name)
			direct[n.name] = append(direct[n.name], float64(got)/(1<<20)/d.Seconds())
		}
	}
	// Exec round trips, nodes interleaved ABAB so both see the same load: a warm-up
	// of execWarmup each (connections, caches, page cache) is left out, then execRuns
	// each through kubectl and kube-apiserver, then execRuns each straight to the
	// kubelet's /exec (SPDY, as kube-apiserver's kubelet client): the kubelet's share.
	const execWarmup, execRuns = 10, 200
	t.Logf("load average before exec: %s", loadAvg(t))
	lat := map[string][]time.Duration{}
	for i := 0; i < execWarmup+execRuns; i++ {
		for _, n := range nodes {
			start := time.Now()
			_, e, code := runKubectl(t, admin, "", 30*time.Second, "exec", "big-"+n.name, "--", "true")
			require.Equal(t, 0, code, e)
			if i >= execWarmup {
				lat[n.name] = append(lat[n.name], time.Since(start))
			}
		}
	}
	t.Logf("load average after kubectl exec: %s", loadAvg(t))
	for _, n := range nodes {
		t.Logf("%-8s kubectl exec -- true over %d: %s", n.name, execRuns, latSummary(lat[n.name]))
	}
	directExec := map[string][]time.Duration{}
	for i := 0; i < execWarmup+execRuns; i++ {
		for _, n := range nodes {
			d := kubeletExec(t, n, cert, "big-"+n.name)
			if i >= execWarmup {
				directExec[n.name] = append(directExec[n.name], d)
			}
		}
	}
	t.Logf("load average after direct exec: %s", loadAvg(t))
	med := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	for _, n := range nodes {
		t.Logf("%-8s kubectl logs 100 MiB: median %.1f MiB/s over %d runs %v", n.name, med(rate[n.name]), logRuns, fmtRates(rate[n.name]))
		t.Logf("%-8s kubelet API containerLogs 100 MiB: median %.1f MiB/s over %d runs %v", n.name, med(direct[n.name]), logRuns, fmtRates(direct[n.name]))
		t.Logf("%-8s kubelet API exec true over %d: %s", n.name, execRuns, latSummary(directExec[n.name]))
	}
	ratio := func(m map[string][]time.Duration, p float64) float64 {
		return float64(percentile(m["nodekit"], p)) / float64(percentile(m["upstream"], p))
	}
	t.Logf("nodekit/upstream: kubectl logs throughput %.2f, direct logs throughput %.2f", med(rate["nodekit"])/med(rate["upstream"]), med(direct["nodekit"])/med(direct["upstream"]))
	for _, m := range []struct {
		name string
		v    map[string][]time.Duration
	}{{"kubectl exec", lat}, {"direct exec", directExec}} {
		var parts []string
		for _, p := range []float64{0.5, 0.9, 0.99} {
			lo, hi := ratioCI(m.v["nodekit"], m.v["upstream"], p)
			parts = append(parts, fmt.Sprintf("p%d %.2f [%.2f, %.2f]", int(p*100), ratio(m.v, p), lo, hi))
		}
		t.Logf("nodekit/upstream %s (95%% bootstrap interval): %s", m.name, strings.Join(parts, "; "))
	}
}

// ratioCI is a 95% bootstrap interval of the ratio of a's percentile p to b's:
// both sides resampled with replacement 2000 times (fixed seed). With 200 samples
// the p99 is the third slowest, so its interval is wide.
func ratioCI(a, b []time.Duration, p float64) (lo, hi float64) {
	const n = 2000
	r := rand.New(rand.NewPCG(1, 2))
	ra, rb := make([]time.Duration, len(a)), make([]time.Duration, len(b))
	rs := make([]float64, n)
	for i := range rs {
		for j := range ra {
			ra[j] = a[r.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[r.IntN(len(b))]
		}
		rs[i] = float64(percentile(ra, p)) / float64(percentile(rb, p))
	}
	sort.Float64s(rs)
	return rs[n*25/1000], rs[n*975/1000]
}

// kubeletExec runs `true` in pod's main container through the kubelet's /exec inside
// the node's namespace with cert (kube-apiserver's kubelet client certificate) and
// returns how long the whole SPDY session took (connect, upgrade, exec, exit status).
func kubeletExec(t *testing.T, n *testNode, cert *tls.Certificate, pod string) time.Duration {
	t.Helper()
	u, err := url.Parse(fmt.Sprintf("https://%s:10250/exec/default/%s/main?command=true&output=1&error=1", n.env.NodeIP, pod))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	// The upgrade is dialled by kubeletClient's transport: in the node's namespace.
	up, err := streamspdy.NewRoundTripperWithConfig(streamspdy.RoundTripperConfig{
		UpgradeTransport: kubeletClient(n, cert).Transport, PingPeriod: 5 * time.Second,
	})
	require.NoError(t, err)
	ex, err := remotecommand.NewSPDYExecutorForTransports(up, spdy.NewUpgraderForStreaming(up), http.MethodPost, u)
	require.NoError(t, err)
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	d := time.Since(start)
	require.NoError(t, err, "exec true in %s through its kubelet: stderr %q", pod, errb.String())
	return d
}

// percentile is the nearest-rank percentile p (0..1) of v.
func percentile(v []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(p*float64(len(s)-1)+0.5)]
}

func latSummary(v []time.Duration) string {
	var sum time.Duration
	for _, d := range v {
		sum += d
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("p50 %v p90 %v p99 %v max %v mean %v", r(percentile(v, 0.5)), r(percentile(v, 0.9)),
		r(percentile(v, 0.99)), r(percentile(v, 1)), r(sum/time.Duration(len(v))))
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/loadavg")
	require.NoError(t, err)
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

func fmtRates(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = fmt.Sprintf("%.1f", r)
	}
	return "[" + strings.Join(s, " ") + "]"
}
