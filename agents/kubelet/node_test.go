package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

type fakeRuntime struct {
	mu           sync.Mutex
	networkReady bool
	statusErr    error
	images       []*runtimeapi.Image
}

func (f *fakeRuntime) Status(context.Context) (*runtimeapi.RuntimeStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	net := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: true}
	if !f.networkReady {
		net = &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: false, Reason: "NetworkPluginNotReady",
			Message: "Network plugin returns error: cni plugin not initialized"}
	}
	return &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, net,
	}}, nil
}

func (f *fakeRuntime) Version(context.Context) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "1.6.20", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) ListImages(context.Context, *runtimeapi.ImageFilter) ([]*runtimeapi.Image, error) {
	return f.images, nil
}

func (f *fakeRuntime) setNetwork(ready bool) {
	f.mu.Lock()
	f.networkReady = ready
	f.mu.Unlock()
}

// fakeHost lays out the files the machine reader reads, under a temp root.
func fakeHost(t *testing.T) *machine {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"etc/machine-id":                 "0123456789abcdef0123456789abcdef\n",
		"sys/class/dmi/id/product_uuid":  "4c4c4544-0042-4410-8033-b2c04f4a3732\n",
		"proc/sys/kernel/random/boot_id": "b0a1c2d3-0000-1111-2222-333344445555\n",
		"etc/os-release":                 "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
		"sys/devices/system/cpu/online":  "0-1,4\n",
		"proc/meminfo":                   "MemTotal:        4096000 kB\nMemFree:  1000 kB\nMemAvailable:    2048000 kB\n",
		"sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "4\n",
	}
	for p, body := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(body), 0o644))
	}
	return &machine{
		root: root,
		statfs: func(_ string, st *unix.Statfs_t) error {
			// 100 GiB in 4 KiB blocks, 50 GiB free; 1M inodes, 900k free.
			st.Bsize, st.Blocks, st.Bavail, st.Files, st.Ffree = 4096, 100<<18, 50<<18, 1_000_000, 900_000
			return nil
		},
		uname: func(u *unix.Utsname) error {
			copy(u.Release[:], "6.18.0-nodekit")
			return nil
		},
	}
}

func newTestNode(t *testing.T, client *fake.Clientset, rt *fakeRuntime) (*nodeStatus, *clocktesting.FakeClock, *record.FakeRecorder) {
	t.Helper()
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC))
	rec := record.NewFakeRecorder(100)
	return &nodeStatus{
		client: client, name: "node-a", hostname: "node-a", nodeIP: net.ParseIP("10.0.0.5"),
		labels: map[string]string{"tier": "web"}, cfg: cfg, rootDir: "/var/lib/kubelet",
		runtime: rt, machine: fakeHost(t), clock: clk, recorder: rec,
	}, clk, rec
}

func condition(n *corev1.Node, t corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func TestRegisterNodeAsTheKubelet(t *testing.T) {
	client := fake.NewClientset()
	rt := &fakeRuntime{networkReady: true, images: []*runtimeapi.Image{
		{RepoTags: []string{"small:1"}, Size: 10},
		{RepoTags: []string{"big:1"}, RepoDigests: []string{"big@sha256:aa"}, Size: 1000},
	}}
	ns, _, rec := newTestNode(t, client, rt)
	ns.cfg.RegisterWithTaints = []corev1.Taint{{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
	require.NoError(t, ns.register(context.Background()))

	node, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{
		"kubernetes.io/hostname": "node-a", "kubernetes.io/os": runtime.GOOS, "kubernetes.io/arch": runtime.GOARCH,
		"beta.kubernetes.io/os": runtime.GOOS, "beta.kubernetes.io/arch": runtime.GOARCH, "tier": "web",
	}, node.Labels)
	assert.Equal(t, "true", node.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"])
	assert.Equal(t, ns.cfg.RegisterWithTaints, node.Spec.Taints)
	assert.Equal(t, []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}, {Type: corev1.NodeHostName, Address: "node-a"}}, node.Status.Addresses)
	assert.Equal(t, int32(10250), node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	assert.Equal(t, corev1.NodeSystemInfo{
		MachineID: "0123456789abcdef0123456789abcdef", SystemUUID: "4c4c4544-0042-4410-8033-b2c04f4a3732",
		BootID: "b0a1c2d3-0000-1111-2222-333344445555", KernelVersion: "6.18.0-nodekit",
		OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://1.6.20",
		KubeletVersion: "v1.37.2+nodekit", OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
	}, node.Status.NodeInfo)

	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	assertQty := func(list corev1.ResourceList, name corev1.ResourceName, want string) {
		t.Helper()
		got := list[name]
		assert.Zero(t, got.Cmp(q(want)), "%s: got %s want %s", name, got.String(), want)
	}
	assertQty(node.Status.Capacity, corev1.ResourceCPU, "3")
	assertQty(node.Status.Capacity, corev1.ResourceMemory, "4096000Ki")
	assertQty(node.Status.Capacity, corev1.ResourcePods, "110")
	assertQty(node.Status.Capacity, "hugepages-2Mi", "8Mi")
	assertQty(node.Status.Capacity, corev1.ResourceEphemeralStorage, "100Gi")
	// Allocatable: memory less the 100Mi hard eviction threshold and the huge pages;
	// ephemeral storage less nodefs.available's 10%.
	assertQty(node.Status.Allocatable, corev1.ResourceMemory, "3985408Ki")
	assertQty(node.Status.Allocatable, corev1.ResourceEphemeralStorage, "92160Mi")
	assertQty(node.Status.Allocatable, corev1.ResourcePods, "110")

	require.Len(t, node.Status.Images, 2)
	assert.Equal(t, []string{"big@sha256:aa", "big:1"}, node.Status.Images[0].Names, "largest image first, digests then tags")

	types := []corev1.NodeConditionType{}
	for _, c := range node.Status.Conditions {
		types = append(types, c.Type)
	}
	assert.Equal(t, []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady}, types)
	assert.Equal(t, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse,
		Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available",
		LastHeartbeatTime: metav1.NewTime(ns.clock.Now()), LastTransitionTime: metav1.NewTime(ns.clock.Now())},
		condition(node, corev1.NodeMemoryPressure))
	assert.Equal(t, "KubeletHasNoDiskPressure", condition(node, corev1.NodeDiskPressure).Reason)
	assert.Equal(t, "kubelet has sufficient PID available", condition(node, corev1.NodePIDPressure).Message)
	ready := condition(node, corev1.NodeReady)
	assert.Equal(t, corev1.ConditionTrue, ready.Status)
	assert.Equal(t, "KubeletReady", ready.Reason)
	assert.Equal(t, "kubelet is posting ready status", ready.Message)

	events := drain(rec)
	assert.Contains(t, events, "Normal NodeHasSufficientMemory Node node-a status is now: NodeHasSufficientMemory")
	assert.Contains(t, events, "Normal NodeHasNoDiskPressure Node node-a status is now: NodeHasNoDiskPressure")
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestAdoptExistingNode(t *testing.T) {
	existing := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		"kubernetes.io/hostname": "old-name", "team": "kept",
	}}}
	client := fake.NewClientset(existing)
	ns, _, _ := newTestNode(t, client, &fakeRuntime{networkReady: true})
	require.NoError(t, ns.register(context.Background()))
	node, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "node-a", node.Labels["kubernetes.io/hostname"], "default labels reconciled")
	assert.Equal(t, "kept", node.Labels["team"], "other labels left alone")
	assert.Equal(t, "true", node.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"])
}

func TestNodeNotReadyWithoutCNI(t *testing.T) {
	client := fake.NewClientset()
	rt := &fakeRuntime{networkReady: true}
	ns, clk, rec := newTestNode(t, client, rt)
	ctx := context.Background()
	require.NoError(t, ns.register(ctx))
	drain(rec)

	rt.setNetwork(false)
	clk.Step(10 * time.Second)
	require.NoError(t, ns.update(ctx))
	node, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	ready := condition(node, corev1.NodeReady)
	assert.Equal(t, corev1.ConditionFalse, ready.Status)
	assert.Equal(t, "KubeletNotReady", ready.Reason)
	assert.Equal(t, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized", ready.Message)
	assert.True(t, clk.Now().Equal(ready.LastTransitionTime.Time), "transition time moved")
	assert.Equal(t, []string{"Normal NodeNotReady Node node-a status is now: NodeNotReady"}, drain(rec))
	assert.False(t, ns.lastReadiness().Ready)

	rt.setNetwork(true)
	clk.Step(10 * time.Second)
	require.NoError(t, ns.update(ctx))
	node, err = client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ConditionTrue, condition(node, corev1.NodeReady).Status)
	assert.Equal(t, []string{"Normal NodeReady Node node-a status is now: NodeReady"}, drain(rec))
}

// Status is computed every period but written only on change or after
// nodeStatusReportFrequency, as the kubelet does.
func TestNodeStatusWrittenOnChangeOrReportFrequency(t *testing.T) {
	client := fake.NewClientset()
	rt := &fakeRuntime{networkReady: true}
	ns, clk, _ := newTestNode(t, client, rt)
	ctx := context.Background()
	require.NoError(t, ns.register(ctx))
	patches := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	require.NoError(t, ns.update(ctx))
	assert.Equal(t, 1, patches(), "first update is always written")
	for range 5 {
		clk.Step(10 * time.Second)
		require.NoError(t, ns.update(ctx))
	}
	assert.Equal(t, 1, patches(), "nothing changed: no write within the report frequency")
	clk.Step(5 * time.Minute)
	require.NoError(t, ns.update(ctx))
	assert.Equal(t, 2, patches(), "report frequency elapsed: written")
	rt.setNetwork(false)
	clk.Step(10 * time.Second)
	require.NoError(t, ns.update(ctx))
	assert.Equal(t, 3, patches(), "Ready changed: written at once")
}

// A failed write is retried (up to nodeStatusUpdateRetry) with a fresh read.
func TestNodeStatusRetriesConflicts(t *testing.T) {
	client := fake.NewClientset()
	ns, _, _ := newTestNode(t, client, &fakeRuntime{networkReady: true})
	ctx := context.Background()
	require.NoError(t, ns.register(ctx))
	fails := 2
	client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		if fails > 0 {
			fails--
			return true, nil, apierrorsConflict()
		}
		return false, nil, nil
	})
	require.NoError(t, ns.update(ctx))
	assert.Equal(t, 0, fails)
	node, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ConditionTrue, condition(node, corev1.NodeReady).Status)
}

func TestMemoryPressure(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	assert.False(t, ns.pressure().memory)
	require.NoError(t, os.WriteFile(filepath.Join(ns.machine.root, "proc/meminfo"),
		[]byte("MemTotal: 4096000 kB\nMemAvailable: 50000 kB\n"), 0o644))
	assert.True(t, ns.pressure().memory, "50000 kB available is under the 100Mi threshold")
	node := &corev1.Node{}
	ns.setStatus(context.Background(), node)
	c := condition(node, corev1.NodeMemoryPressure)
	assert.Equal(t, corev1.ConditionTrue, c.Status)
	assert.Equal(t, "KubeletHasInsufficientMemory", c.Reason)
}

func TestRuntimeDownIsNotReady(t *testing.T) {
	rt := &fakeRuntime{statusErr: context.DeadlineExceeded}
	ns, _, _ := newTestNode(t, fake.NewClientset(), rt)
	node := &corev1.Node{}
	ns.setStatus(context.Background(), node)
	c := condition(node, corev1.NodeReady)
	assert.Equal(t, corev1.ConditionFalse, c.Status)
	assert.Equal(t, "container runtime is down", c.Message)
}

func apierrorsConflict() error {
	return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "node-a", errors.New("the object has been modified"))
}
