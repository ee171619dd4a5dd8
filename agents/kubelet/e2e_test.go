package main_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// kubeletBin is the agent's binary, built once by TestMain: the real-parts tests run
// the kubelet as operators do, as a process.
var kubeletBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "nk-kubelet-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kubeletBin = filepath.Join(dir, "kubelet")
	// Built as hack/up.sh builds it: with -tags grpcnotrace, so that the linker removes
	// the methods nothing calls (see hack/lint.sh).
	args := []string{"build", "-tags", "grpcnotrace", "-o", kubeletBin}
	// NODEKIT_KUBELET_RACE=1 builds the agent with the race detector; the tests then
	// fail on any "WARNING: DATA RACE" in its log.
	if os.Getenv("NODEKIT_KUBELET_RACE") == "1" {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the kubelet: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testNode is one node: a network namespace (from netns) holding containerd's CNI
// bridge and the kubelet, which reaches the API server through a forwarder on the
// namespace's own loopback.
type testNode struct {
	name    string
	cp      *controlplane.ControlPlane
	env     *netns.Env
	ctd     *containerd.Containerd
	dir     string
	args    []string
	kubelet *testenv.Process
	admin   kubernetes.Interface
	runtime *cri.Client
	// kubeletEnv is added to the kubelet's environment.
	kubeletEnv []string
	// cgroupRoot is the node's own cgroupRoot, so nodes never share a kubepods
	// tree (each kubelet removes pod cgroups it does not know).
	cgroupRoot string
	// apiURL is the API server as seen from the node's namespace (set by
	// startBenchNode).
	apiURL string
}

// nodeConfig turns image garbage collection off (high threshold 100, no maximum
// age, as upstream reads it): this machine's disk is used above the default 85%,
// and the images the tests import cannot be pulled again. TestKubeletGarbageCollection
// turns it on.
const nodeConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: 2s
nodeLeaseDurationSeconds: 8
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
syncFrequency: 10s
imageGCHighThresholdPercent: 100
`

func startNode(t testing.TB, cp *controlplane.ControlPlane, name string, cni bool) *testNode {
	t.Helper()
	return startNodeWithConfig(t, cp, name, cni, "")
}

// startNodeWithConfig is startNode with more KubeletConfiguration lines.
func startNodeWithConfig(t testing.TB, cp *controlplane.ControlPlane, name string, cni bool, extraConfig string) *testNode {
	t.Helper()
	return startNodeWith(t, cp, name, cni, nodeOptions{config: extraConfig})
}

// startNodeOn is startNodeWithConfig on the containerd binaries in containerdDir
// (containerd.V2Dir for containerd 2.x); "" is the machine's.
func startNodeOn(t testing.TB, cp *controlplane.ControlPlane, name string, cni bool, extraConfig, containerdDir string) *testNode {
	t.Helper()
	return startNodeWith(t, cp, name, cni, nodeOptions{config: extraConfig, containerdDir: containerdDir})
}

// nodeOptions are a test node's additions to the kubelet's start.
type nodeOptions struct {
	config        string   // more KubeletConfiguration lines
	args          []string // more kubelet flags
	env           []string // more environment for the kubelet process
	containerdDir string   // containerd binaries to run; "" is the machine's
}

func startNodeWith(t testing.TB, cp *controlplane.ControlPlane, name string, cni bool, opts nodeOptions) *testNode {
	t.Helper()
	extraConfig := opts.config
	testenv.RequireRoot(t)
	n := &testNode{name: name, cp: cp, admin: cp.AdminClient()}
	n.env = netns.New(t, netns.Config{Pods: 1})
	// Before containerd: removed after containerd has stopped the pods in it.
	n.cgroupRoot = makeCgroupRoot(t, name)
	n.ctd = containerd.Start(t, containerd.Options{CNI: cni, NetNS: n.env.Node.Path(), BinDir: opts.containerdDir})
	conn := n.ctd.Conn(t)
	rt, err := cri.NewWithConn(context.Background(), conn, cri.Config{})
	require.NoError(t, err)
	n.runtime = rt
	fwd := n.env.Node.Forward(t, strings.TrimPrefix(cp.URL(), "https://"))
	dir, err := os.MkdirTemp("", "nk-kubelet-")
	require.NoError(t, err)
	t.Cleanup(func() {
		// Pods left on the node keep their tmpfs volumes (projected, secret) mounted
		// under the root dir; detach them, deepest first, before removing it.
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	n.dir = dir
	cp.WriteNodeKubeconfig(t, filepath.Join(dir, "kubeconfig"), name, "https://"+fwd)
	// The kubelet API trusts the cluster CA's client certificates (kube-apiserver's
	// --kubelet-client-certificate), as kubeadm configures it.
	cfg := withTestEvictionHard(nodeConfig + fmt.Sprintf("podLogsDir: %s\nstaticPodPath: %s\ncgroupRoot: %s\nauthentication:\n  x509:\n    clientCAFile: %s\n",
		filepath.Join(dir, "logs"), filepath.Join(dir, "manifests"), n.cgroupRoot, cp.CAFile()) + extraConfig)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "manifests"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600))
	n.args = []string{
		"--net=" + n.env.Node.Path(), kubeletBin,
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--kubeconfig=" + filepath.Join(dir, "kubeconfig"),
		"--hostname-override=" + name,
		"--node-ip=" + n.env.NodeIP.String(),
		"--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "root", "pki"),
		"--container-runtime-endpoint=" + n.ctd.Endpoint(),
		"--node-labels=nodekit.dev/test=" + name,
		"-v=" + verbosity(),
	}
	n.args = append(n.args, opts.args...)
	n.kubeletEnv = opts.env
	n.startKubelet(t)
	// Registered after containerd's, so it runs first: the kubelet stops before
	// containerd and the namespace go away.
	t.Cleanup(func() {
		if n.kubelet != nil {
			n.kubelet.Stop(10 * time.Second)
			if t.Failed() {
				t.Logf("--- kubelet log tail ---\n%s", n.kubelet.Tail(6000))
			}
			if b, err := os.ReadFile(filepath.Join(dir, "kubelet.log")); err == nil && strings.Contains(string(b), "WARNING: DATA RACE") {
				t.Errorf("the kubelet reported a data race:\n%s", b[strings.Index(string(b), "WARNING: DATA RACE"):])
			}
			// NODEKIT_KUBELET_LOGDIR keeps the whole kubelet log for debugging.
			if d := os.Getenv("NODEKIT_KUBELET_LOGDIR"); d != "" {
				if b, err := os.ReadFile(filepath.Join(dir, "kubelet.log")); err == nil {
					_ = os.WriteFile(filepath.Join(d, name+".log"), b, 0o644)
				}
			}
		}
	})
	return n
}

// verbosity is the kubelet's -v in these tests: NODEKIT_KUBELET_V, default 2.
func verbosity() string {
	if v := os.Getenv("NODEKIT_KUBELET_V"); v != "" {
		return v
	}
	return "2"
}

func (n *testNode) startKubelet(t testing.TB) {
	t.Helper()
	p, err := testenv.StartProcess("kubelet", filepath.Join(n.dir, "kubelet.log"), n.kubeletEnv, testenv.LookPath(t, "nsenter"), n.args...)
	require.NoError(t, err)
	n.kubelet = p
}

func (n *testNode) stopKubelet() {
	n.kubelet.Stop(10 * time.Second)
}

func (n *testNode) log(t testing.TB) string {
	b, err := os.ReadFile(filepath.Join(n.dir, "kubelet.log"))
	require.NoError(t, err)
	return string(b)
}

func eventually(t testing.TB, timeout time.Duration, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := check()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func nodeCondition(node *corev1.Node, t corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range node.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func (n *testNode) waitReady(t testing.TB, status corev1.ConditionStatus, timeout time.Duration) *corev1.Node {
	t.Helper()
	var node *corev1.Node
	eventually(t, timeout, fmt.Sprintf("node %s Ready=%s", n.name, status), func() (bool, string) {
		got, err := n.admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		node = got
		c := nodeCondition(got, corev1.NodeReady)
		return c.Status == status, fmt.Sprintf("%+v", c)
	})
	return node
}

func kubectl(t testing.TB, cp *controlplane.ControlPlane, args ...string) string {
	t.Helper()
	bin := testenv.PeerBinary(t, "kubectl")
	out, err := exec.Command(bin, append([]string{"--kubeconfig", cp.AdminKubeconfig()}, args...)...).CombinedOutput()
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

func hostOSImage(t testing.TB) string {
	b, err := os.ReadFile("/etc/os-release")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "Linux"
}

func kernelRelease(t testing.TB) string {
	var u unix.Utsname
	require.NoError(t, unix.Uname(&u))
	return unix.ByteSliceToString(u.Release[:])
}

func busyboxPod(name, image string, restart corev1.RestartPolicy, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 restart,
			AutomountServiceAccountToken:  new(bool),
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", script},
			}},
		},
	}
}

func (n *testNode) createPod(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Spec.NodeName = n.name
	got, err := n.admin.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	return got
}

func (n *testNode) waitPod(t testing.TB, name string, timeout time.Duration, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, "pod "+name+" "+what, func() (bool, string) {
		p, err := n.admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return ok(p), fmt.Sprintf("phase=%s conditions=%+v containers=%+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// runtimeContainers lists the runtime's containers of a pod, as crictl ps -a would.
func (n *testNode) runtimeContainers(t testing.TB, uid types.UID) []*runtimeapi.Container {
	t.Helper()
	cs, err := n.runtime.ListContainers(context.Background(), &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{cri.LabelPodUID: string(uid)},
	})
	require.NoError(t, err)
	return cs
}

// TestKubeletNode runs the agent as its binary against a real control plane and a
// real containerd whose networking lives in a test-made namespace, and checks what
// kubectl and the runtime see: the node, pods through their lifecycle, and what
// stopping and restarting the agent does and does not do.
func TestKubeletNode(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true})
	n := startNode(t, cp, "nk-node-a", true)
	image := n.ctd.BusyboxImage()

	t.Run("node Ready in kubectl get nodes -o wide", func(t *testing.T) {
		node := n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
		ready := nodeCondition(node, corev1.NodeReady)
		assert.Equal(t, "KubeletReady", ready.Reason)
		assert.Equal(t, "kubelet is posting ready status", ready.Message)
		assert.Equal(t, "v1.37.2+nodekit", node.Status.NodeInfo.KubeletVersion)
		assert.Equal(t, "nk-node-a", node.Labels["nodekit.dev/test"])

		out := kubectl(t, cp, "get", "nodes", "-o", "wide")
		t.Logf("kubectl get nodes -o wide:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2)
		header := strings.Fields(lines[0])
		assert.Equal(t, []string{"NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"}, header)
		row := lines[1]
		assert.True(t, strings.HasPrefix(row, "nk-node-a "), row)
		assert.Contains(t, row, " Ready ")
		assert.Contains(t, row, " v1.37.2+nodekit ")
		assert.Contains(t, row, " "+n.env.NodeIP.String()+" ")
		assert.Contains(t, row, hostOSImage(t))
		assert.Contains(t, row, kernelRelease(t))
		assert.Regexp(t, `containerd://[0-9]+\.[0-9]+\.[0-9]+\S*$`, row)

		// The heartbeat Lease, and /healthz and /metrics on the node's loopback.
		var l *coordinationv1.Lease
		eventually(t, 20*time.Second, "the node's Lease", func() (bool, string) {
			got, err := n.admin.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), n.name, metav1.GetOptions{})
			l = got
			return err == nil, fmt.Sprint(err)
		})
		require.Len(t, l.OwnerReferences, 1)
		assert.Equal(t, "Node", l.OwnerReferences[0].Kind)
		assert.Equal(t, n.name, *l.Spec.HolderIdentity)
		assert.Equal(t, int32(8), *l.Spec.LeaseDurationSeconds)
		hc := n.env.Node.HTTPClient(5 * time.Second)
		body := httpGet(t, hc, "http://127.0.0.1:10248/healthz")
		assert.Equal(t, "ok", body)
		metrics := httpGet(t, hc, "http://127.0.0.1:10248/metrics")
		assert.Contains(t, metrics, `kubelet_node_name{node="nk-node-a"} 1`)
	})

	var runningUID types.UID
	var runningContainerID string
	t.Run("a pod runs and reads Running and Ready", func(t *testing.T) {
		p := n.createPod(t, busyboxPod("web", image, corev1.RestartPolicyAlways, "sleep 3600"))
		got := n.waitPod(t, "web", 60*time.Second, "Running and Ready", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && podReady(p)
		})
		runningUID = p.UID
		require.Len(t, got.Status.ContainerStatuses, 1)
		cs := got.Status.ContainerStatuses[0]
		assert.True(t, strings.HasPrefix(cs.ContainerID, "containerd://"), cs.ContainerID)
		runningContainerID = strings.TrimPrefix(cs.ContainerID, "containerd://")
		assert.NotNil(t, cs.State.Running)
		assert.True(t, cs.Ready)
		assert.Equal(t, int32(0), cs.RestartCount)
		assert.NotEmpty(t, got.Status.PodIP)
		assert.True(t, n.ctd.Subnet().Contains(netIP(got.Status.PodIP)), "pod IP %s from the CNI bridge's %s", got.Status.PodIP, n.ctd.Subnet())
		assert.Equal(t, n.env.NodeIP.String(), got.Status.HostIP)
		assert.Equal(t, corev1.PodQOSBestEffort, got.Status.QOSClass)

		out := kubectl(t, cp, "get", "pod", "web", "--no-headers")
		assert.Regexp(t, `^web\s+1/1\s+Running\s+0\s`, out)
		events := kubectl(t, cp, "get", "events", "--field-selector", "involvedObject.name=web", "-o", "custom-columns=REASON:.reason", "--no-headers")
		for _, reason := range []string{"Pulled", "Created", "Started"} {
			assert.Contains(t, events, reason)
		}
		// crictl's view: the sandbox and container carry the kubelet's names.
		sbs, err := n.runtime.ListPodSandbox(context.Background(), &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{cri.LabelPodUID: string(p.UID)}})
		require.NoError(t, err)
		require.Len(t, sbs, 1)
		assert.Equal(t, "web", sbs[0].GetMetadata().GetName())
		assert.Equal(t, "default", sbs[0].GetMetadata().GetNamespace())
	})

	t.Run("admission judges against the Node as it is now: a label added just before the pod", func(t *testing.T) {
		// The scheduler's conformance specs label a node and have a pod requiring the
		// label scheduled at once; the kubelet must see the label through its Node
		// watch, not wait for its next status update (every 10 s). The pod is bound
		// here directly, so it gets the 2 s a scheduler would take to see the label
		// too: the kubelet's Node and pod watches are two streams, and under load the
		// pod's can arrive first (upstream's kubelet has the same race). A kubelet
		// that waits for its status loop still fails: each round passes with odds of
		// about 2 in 10, all three with under 1 in 100.
		for i := range 3 {
			value := fmt.Sprintf("v%d", i)
			patch := fmt.Sprintf(`{"metadata":{"labels":{"nodekit.dev/admit-now":%q}}}`, value)
			_, err := n.admin.CoreV1().Nodes().Patch(context.Background(), n.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
			time.Sleep(2 * time.Second)
			name := "labelled-" + value
			p := busyboxPod(name, image, corev1.RestartPolicyAlways, "sleep 3600")
			p.Spec.NodeSelector = map[string]string{"nodekit.dev/admit-now": value}
			n.createPod(t, p)
			got := n.waitPod(t, name, 60*time.Second, "Running or Failed", func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed
			})
			require.Equal(t, corev1.PodRunning, got.Status.Phase, "reason=%s message=%s", got.Status.Reason, got.Status.Message)
		}
		// A selector the node does not match is still refused, with the kubelet's words.
		p := busyboxPod("unlabelled", image, corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.NodeSelector = map[string]string{"nodekit.dev/admit-now": "never"}
		n.createPod(t, p)
		got := n.waitPod(t, "unlabelled", 60*time.Second, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		assert.Equal(t, "NodeAffinity", got.Status.Reason)
		assert.Equal(t, "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector", got.Status.Message)
		for _, name := range []string{"labelled-v0", "labelled-v1", "labelled-v2", "unlabelled"} {
			require.NoError(t, n.admin.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}))
		}
	})

	t.Run("restartPolicy Never gives Succeeded and Failed with exit codes", func(t *testing.T) {
		n.createPod(t, busyboxPod("ok", image, corev1.RestartPolicyNever, "exit 0"))
		n.createPod(t, busyboxPod("bad", image, corev1.RestartPolicyNever, "echo broken >/dev/termination-log; exit 3"))
		ok := n.waitPod(t, "ok", 60*time.Second, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
		term := ok.Status.ContainerStatuses[0].State.Terminated
		require.NotNil(t, term)
		assert.Equal(t, int32(0), term.ExitCode)
		assert.Equal(t, "Completed", term.Reason)
		bad := n.waitPod(t, "bad", 60*time.Second, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		term = bad.Status.ContainerStatuses[0].State.Terminated
		require.NotNil(t, term)
		assert.Equal(t, int32(3), term.ExitCode)
		assert.Equal(t, "Error", term.Reason)
		assert.Equal(t, "broken\n", term.Message, "termination message from terminationMessagePath")
		out := kubectl(t, cp, "get", "pods", "ok", "bad", "--no-headers")
		assert.Regexp(t, `(?m)^ok\s+0/1\s+Completed\s+0\s`, out)
		assert.Regexp(t, `(?m)^bad\s+0/1\s+Error\s+0\s`, out)
	})

	t.Run("a crashing container shows CrashLoopBackOff", func(t *testing.T) {
		n.createPod(t, busyboxPod("crash", image, corev1.RestartPolicyAlways, "exit 1"))
		got := n.waitPod(t, "crash", 90*time.Second, "in CrashLoopBackOff after a restart", func(p *corev1.Pod) bool {
			if len(p.Status.ContainerStatuses) == 0 {
				return false
			}
			cs := p.Status.ContainerStatuses[0]
			return cs.RestartCount >= 1 && cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
		})
		cs := got.Status.ContainerStatuses[0]
		assert.Contains(t, cs.State.Waiting.Message, "back-off")
		require.NotNil(t, cs.LastTerminationState.Terminated)
		assert.Equal(t, int32(1), cs.LastTerminationState.Terminated.ExitCode)
		out := kubectl(t, cp, "get", "pod", "crash", "--no-headers")
		assert.Regexp(t, `^crash\s+0/1\s+CrashLoopBackOff\s+\d+`, out)
		events := kubectl(t, cp, "get", "events", "--field-selector", "involvedObject.name=crash", "-o", "custom-columns=REASON:.reason", "--no-headers")
		assert.Contains(t, events, "BackOff")
	})

	t.Run("agent stopped: node Unknown while the container keeps running; restarted: nothing restarts", func(t *testing.T) {
		require.NotEmpty(t, runningContainerID)
		crash, err := n.admin.CoreV1().Pods("default").Get(context.Background(), "crash", metav1.GetOptions{})
		require.NoError(t, err)
		crashRestarts := crash.Status.ContainerStatuses[0].RestartCount

		n.stopKubelet()
		stopped := time.Now()
		eventually(t, 40*time.Second, "node Ready=Unknown", func() (bool, string) {
			node, err := n.admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := nodeCondition(node, corev1.NodeReady)
			return c.Status == corev1.ConditionUnknown, fmt.Sprintf("%+v", c)
		})
		t.Logf("node Unknown %s after the kubelet stopped", time.Since(stopped).Round(100*time.Millisecond))
		node, err := n.admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "NodeStatusUnknown", nodeCondition(node, corev1.NodeReady).Reason)
		assert.Equal(t, "Kubelet stopped posting node status.", nodeCondition(node, corev1.NodeReady).Message)
		st, err := n.runtime.ContainerStatus(context.Background(), runningContainerID)
		require.NoError(t, err)
		assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState(), "the pod's container keeps running without its kubelet")

		n.startKubelet(t)
		n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
		// Give the restarted agent a few sync rounds to (wrongly) touch anything.
		time.Sleep(5 * time.Second)
		web := n.waitPod(t, "web", 30*time.Second, "Running and Ready again", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && podReady(p)
		})
		cs := web.Status.ContainerStatuses[0]
		assert.Equal(t, "containerd://"+runningContainerID, cs.ContainerID, "the same container, adopted")
		assert.Equal(t, int32(0), cs.RestartCount)
		assert.Len(t, n.runtimeContainers(t, runningUID), 1, "no new container was made")
		st, err = n.runtime.ContainerStatus(context.Background(), runningContainerID)
		require.NoError(t, err)
		assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
		crash, err = n.admin.CoreV1().Pods("default").Get(context.Background(), "crash", metav1.GetOptions{})
		require.NoError(t, err)
		assert.GreaterOrEqual(t, crash.Status.ContainerStatuses[0].RestartCount, crashRestarts, "restart count not reset")
	})

	t.Run("containerd restarted: the kubelet reconnects and carries on", func(t *testing.T) {
		n.ctd.Kill()
		n.ctd.Restart(t)
		st, err := n.runtime.ContainerStatus(context.Background(), runningContainerID)
		require.NoError(t, err)
		assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
		n.createPod(t, busyboxPod("after-containerd", image, corev1.RestartPolicyAlways, "sleep 3600"))
		n.waitPod(t, "after-containerd", 60*time.Second, "Running and Ready", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && podReady(p)
		})
		assert.Len(t, n.runtimeContainers(t, runningUID), 1, "the old pod was left alone")
	})

	t.Run("API server down: pods keep running; status catches up", func(t *testing.T) {
		cp.StopAPIServer(t)
		time.Sleep(5 * time.Second)
		st, err := n.runtime.ContainerStatus(context.Background(), runningContainerID)
		require.NoError(t, err)
		assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
		cp.StartAPIServer(t)
		n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
		web := n.waitPod(t, "web", 30*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		assert.Equal(t, "containerd://"+runningContainerID, web.Status.ContainerStatuses[0].ContainerID)
		// A pod created once the API server is back runs: the informer resumed.
		n.createPod(t, busyboxPod("after-apiserver", image, corev1.RestartPolicyAlways, "sleep 3600"))
		n.waitPod(t, "after-apiserver", 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	})
}

func httpGet(t testing.TB, c interface {
	Get(string) (*http.Response, error)
}, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, b)
	return string(b)
}

func netIP(s string) net.IP { return net.ParseIP(s) }

// The seed's story: a node whose network plugin never started is NotReady with the
// runtime's own words, in the API and in the kubelet's log; installing the plugin
// brings it back Ready on its own; losing it again logs "Node became not ready".
func TestKubeletNodeNotReadyWithoutCNI(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-nocni", false)
	const seedMessage = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
	const seedLog = `"Container runtime network not ready" networkReady="NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"`

	node := n.waitReady(t, corev1.ConditionFalse, 60*time.Second)
	ready := nodeCondition(node, corev1.NodeReady)
	assert.Equal(t, "KubeletNotReady", ready.Reason)
	assert.Equal(t, seedMessage, ready.Message)
	assert.Contains(t, n.log(t), seedLog)
	out := kubectl(t, cp, "get", "node", n.name, "--no-headers")
	assert.Regexp(t, `^nk-nocni\s+NotReady\s`, out)

	require.NoError(t, n.ctd.WriteCNIConfig())
	eventually(t, 60*time.Second, "node Ready after the CNI config appeared", func() (bool, string) {
		got, err := n.admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := nodeCondition(got, corev1.NodeReady)
		return c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
	})
	t.Log("node Ready on its own once the CNI config was written")

	// The network plugin goes away (containerd restarts without its config): the
	// node goes NotReady again and the kubelet logs the transition, as in the seed.
	n.ctd.Kill()
	require.NoError(t, os.Remove(filepath.Join(n.ctd.Dir(), "cni", "10-nodekit.conflist")))
	n.ctd.Restart(t)
	node = n.waitReady(t, corev1.ConditionFalse, 60*time.Second)
	assert.Equal(t, seedMessage, nodeCondition(node, corev1.NodeReady).Message)
	eventually(t, 10*time.Second, "the Node became not ready log line", func() (bool, string) {
		l := n.log(t)
		return strings.Contains(l, `"Node became not ready" node="nk-nocni" condition={"Type":"Ready","Status":"False"`) &&
			strings.Contains(l, `"Reason":"KubeletNotReady","Message":"`+seedMessage+`"}`), "not logged yet"
	})
	events := kubectl(t, cp, "get", "events", "--field-selector", "involvedObject.name=nk-nocni", "-o", "custom-columns=REASON:.reason", "--no-headers")
	assert.Contains(t, events, "NodeNotReady")
	assert.Contains(t, events, "NodeReady")
}

func unmountUnder(t testing.TB, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", m, err)
		}
	}
}
