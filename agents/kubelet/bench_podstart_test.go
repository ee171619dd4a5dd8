package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// readyWatch records when each pod of the default namespace was first seen Ready
// through one informer: both kubelets' pods are timed by the same watch, so neither
// pays a polling interval the other does not.
type readyWatch struct {
	mu    sync.Mutex
	ready map[string]time.Time
}

func startReadyWatch(t *testing.T, cp *controlplane.ControlPlane) *readyWatch {
	t.Helper()
	w := &readyWatch{ready: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactoryWithOptions(cp.AdminClient(), 0, informers.WithNamespace("default"))
	inf := factory.Core().V1().Pods().Informer()
	seen := func(obj any) {
		now := time.Now()
		p, ok := obj.(*corev1.Pod)
		if !ok || !podReady(p) {
			return
		}
		w.mu.Lock()
		if _, ok := w.ready[string(p.UID)]; !ok {
			w.ready[string(p.UID)] = now
		}
		w.mu.Unlock()
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	})
	require.NoError(t, err)
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.HasSynced), "pod informer synced")
	return w
}

// wait returns when every uid was seen Ready, with the times, or fails after timeout.
func (w *readyWatch) wait(t *testing.T, uids []string, timeout time.Duration) []time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		out := make([]time.Time, len(uids))
		missing := 0
		for i, u := range uids {
			if out[i] = w.ready[u]; out[i].IsZero() {
				missing++
			}
		}
		w.mu.Unlock()
		if missing == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods not Ready after %s", missing, len(uids), timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// createPods creates the pods at once (one goroutine each) and returns each pod's
// UID and the time just before its create call.
func createPods(t *testing.T, cp *controlplane.ControlPlane, pods []*corev1.Pod) ([]string, []time.Time) {
	t.Helper()
	uids := make([]string, len(pods))
	starts := make([]time.Time, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			starts[i] = time.Now()
			got, err := cp.AdminClient().CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{})
			if err != nil {
				errs[i] = fmt.Errorf("create pod %s: %w", p.Name, err)
				return
			}
			uids[i] = string(got.UID)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return uids, starts
}

// deletePods deletes the pods of node (grace 0 as the pods ask) and waits until the
// API server has none left there.
func deletePods(t *testing.T, cp *controlplane.ControlPlane, node string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + node}
	require.NoError(t, cp.AdminClient().CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, sel))
	eventually(t, timeout, "the pods of "+node+" deleted", func() (bool, string) {
		l, err := cp.AdminClient().CoreV1().Pods("default").List(ctx, sel)
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d pods left", len(l.Items))
	})
}

// waitRuntimeQuiet waits until the node's runtime runs no container and no ready
// sandbox: the kubelet has stopped every pod deleted from the API. (The upstream
// kubelet leaves stopped sandboxes to its garbage collection, nodekit removes them at
// once; either way nothing is being torn down any more when this returns.)
func waitRuntimeQuiet(t *testing.T, n *testNode, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	eventually(t, timeout, "the runtime of "+n.name+" quiet", func() (bool, string) {
		sbs, err := n.runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}})
		if err != nil {
			return false, err.Error()
		}
		ctrs, err := n.runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
		if err != nil {
			return false, err.Error()
		}
		return len(sbs) == 0 && len(ctrs) == 0, fmt.Sprintf("%d ready sandboxes, %d running containers", len(sbs), len(ctrs))
	})
}

// startDirectNode is a containerd with no kubelet beside it: pods started straight through
// CRI there are never seen as orphans and removed by a kubelet's relist midway.
func startDirectNode(t testing.TB, extCIDR string) *testNode {
	t.Helper()
	n := &testNode{name: "direct", dir: t.TempDir()}
	require.NoError(t, os.MkdirAll(filepath.Join(n.dir, "direct-logs"), 0o755))
	n.env = netns.New(t, netns.Config{Pods: 1, ExternalCIDR: extCIDR})
	n.ctd = containerd.Start(t, containerd.Options{CNI: true, NetNS: n.env.Node.Path()})
	rt, err := cri.NewWithConn(context.Background(), n.ctd.Conn(t), cri.Config{})
	require.NoError(t, err)
	n.runtime = rt
	return n
}

// procSample is a process's CPU time (user + system) and memory.
type procSample struct {
	cpu      time.Duration
	rss, hwm int64 // bytes
	// anon and file split rss: the heap and stacks, and the binary's pages mapped
	// from the page cache.
	anon, file int64
	threads    int
	at         time.Time
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

func sampleProc(t *testing.T, pid int) procSample {
	t.Helper()
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// Fields after the command, which is in parentheses and may hold spaces.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err := strconv.ParseInt(rest[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseInt(rest[12], 10, 64)
	require.NoError(t, err)
	s.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(st), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			s.rss = v << 10
		case "VmHWM:":
			s.hwm = v << 10
		case "RssAnon:":
			s.anon = v << 10
		case "RssFile:":
			s.file = v << 10
		case "Threads:":
			s.threads = int(v)
		}
	}
	return s
}

// kubeletPID is the kubelet's own PID: nsenter (and, for the peer, unshare and sh)
// exec it in place, so it is the PID the harness started.
func kubeletPID(t *testing.T, n *testNode) int {
	t.Helper()
	pid := n.kubelet.Cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	require.NoError(t, err)
	require.Equal(t, "kubelet", strings.TrimSpace(string(b)), "process %d of node %s is the kubelet", pid, n.name)
	return pid
}

// coldStart drops path's pages from the page cache (written back first), so that
// every measured binary is started as after a reboot: read in by its own page faults.
// A binary left in the cache as the linker wrote it is held in large folios, which
// fault-around maps whole, so the same code reads as more resident than in a binary
// read from disk (the upstream kubelet, built long before, always was); the RSS of
// each side would depend on how its file got into the cache. Pages another process
// still maps stay; the fraction left is logged.
func coldStart(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	fd := int(f.Fd())
	require.NoError(t, unix.Fsync(fd), "fsync %s", path)
	require.NoError(t, unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED), "fadvise %s", path)
	st, err := f.Stat()
	require.NoError(t, err)
	m, err := unix.Mmap(fd, 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer func() { _ = unix.Munmap(m) }()
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore %s: %v", path, errno)
	}
	cached := 0
	for _, v := range vec {
		cached += int(v & 1)
	}
	t.Logf("%s: %.1f%% left in the page cache before its start", path, 100*float64(cached)/float64(len(vec)))
}

// startFloor builds the measuring program at pkg (internal/floor or
// internal/floor/bare) and runs it in n's network namespace as node name, on n's
// containerd and API path, serving on port: the least a kubelet on those libraries
// holds in memory with no pod (see internal/floor's doc).
func startFloor(t *testing.T, cp *controlplane.ControlPlane, n *testNode, pkg, name string, port int) *testenv.Process {
	t.Helper()
	bin := filepath.Join(n.dir, name)
	out, err := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", bin, pkg).CombinedOutput()
	require.NoError(t, err, "build %s: %s", pkg, out)
	coldStart(t, bin)
	kubeconfig := filepath.Join(n.dir, name+".kubeconfig")
	cp.WriteNodeKubeconfig(t, kubeconfig, name, n.apiURL)
	p, err := testenv.StartProcess(name, filepath.Join(n.dir, name+".log"), nil, testenv.LookPath(t, "nsenter"),
		"--net="+n.env.Node.Path(), bin, "--kubeconfig="+kubeconfig, "--hostname-override="+name,
		"--container-runtime-endpoint="+n.ctd.Endpoint(), "--client-ca-file="+cp.CAFile(), "--port="+strconv.Itoa(port), "-v="+verbosity())
	require.NoError(t, err)
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("--- %s log tail ---\n%s", name, p.Tail(4000))
		}
	})
	// Registered, watching and serving: its Lease exists.
	require.Eventually(t, func() bool {
		_, err := cp.AdminClient().CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil
	}, 60*time.Second, 200*time.Millisecond, "the Lease of %s; log:\n%s", name, p.Tail(4000))
	return p
}

func pausePod(name, node, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  new(bool),
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{{Name: "pause", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
}

// TestPodStartBench (NODEKIT_BENCH_POD_START=1) runs nodekit's kubelet and the upstream
// kubelet v1.37.2 side by side on one control plane, each node with its own network
// namespace, containerd and cgroupRoot, and a third containerd with no kubelet for
// the floor: RunPodSandbox + CreateContainer + StartContainer straight through CRI.
//
// Pod start is API create to the pod's Ready condition seen through a watch, image
// present, for 1 pod and for 30 pods created at once; the three sides take turns in
// every round, in a rotating order, so the machine's load falls on all of them.
// Then both nodes get 30 pods and later 110 (maxPods): each kubelet's CPU seconds
// over an idle window and its RSS (VmRSS, VmHWM) are read from /proc.
//
// Two measuring programs, internal/floor and internal/floor/bare, run with no pod
// beside the kubelets through the idle windows: the least a kubelet on the same
// libraries holds in memory, and the same work on client-go's REST client alone.
//
// NODEKIT_BENCH_ROUNDS (default 15) sets the 1-pod rounds; 30-pod rounds are a fifth
// of it (at least 2); NODEKIT_BENCH_IDLE (default 60s) the idle window;
// NODEKIT_BENCH_RESIDENT_DIR, if set, receives hack/resident-sections.py --packages
// for every process at each idle step.
func TestPodStartBench(t *testing.T) {
	if os.Getenv("NODEKIT_BENCH_POD_START") != "1" {
		t.Skip("set NODEKIT_BENCH_POD_START=1 to run the pod start and density benchmark")
	}
	testenv.RequireRoot(t)
	rounds := 15
	if v := os.Getenv("NODEKIT_BENCH_ROUNDS"); v != "" {
		var err error
		rounds, err = strconv.Atoi(v)
		require.NoError(t, err, "NODEKIT_BENCH_ROUNDS")
	}
	idle := 60 * time.Second
	if v := os.Getenv("NODEKIT_BENCH_IDLE"); v != "" {
		var err error
		idle, err = time.ParseDuration(v)
		require.NoError(t, err, "NODEKIT_BENCH_IDLE")
	}
	egress := &addrEgress{}
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: egress.dial})
	nodes := []*testNode{
		startBenchNode(t, cp, egress, "nodekit", "192.0.2.0/24", false),
		startBenchNode(t, cp, egress, "upstream", "198.51.100.0/24", true),
	}
	direct := startDirectNode(t, "203.0.113.0/24")
	for _, n := range nodes {
		n.waitReady(t, corev1.ConditionTrue, 120*time.Second)
		rt, err := cri.NewWithConn(context.Background(), n.ctd.Conn(t), cri.Config{})
		require.NoError(t, err)
		n.runtime = rt
	}
	watch := startReadyWatch(t, cp)
	image := direct.ctd.BusyboxImage()
	t.Logf("load average at start: %s", loadAvg(t))

	lat := map[string]map[int][]time.Duration{}
	add := func(side string, pods int, d ...time.Duration) {
		if lat[side] == nil {
			lat[side] = map[int][]time.Duration{}
		}
		lat[side][pods] = append(lat[side][pods], d...)
	}
	sides := []string{"containerd", "nodekit", "upstream"}
	// startCPU is each kubelet's CPU time from the first create to the last Ready,
	// summed over the recorded rounds, by "side/pods".
	startCPU := map[string]time.Duration{}
	// runSide starts pods on one side; round -1 is a warm-up, not recorded.
	runSide := func(side string, pods, round int) {
		keep := func(d ...time.Duration) {
			if round >= 0 {
				add(side, pods, d...)
			}
		}
		if side == "containerd" {
			keep(direct.runDirect(t, image, pods)...)
			return
		}
		n := nodes[0]
		if side == "upstream" {
			n = nodes[1]
		}
		batch := make([]*corev1.Pod, pods)
		for i := range batch {
			batch[i] = busyboxPod(fmt.Sprintf("start-%s-%d-%d-%d", side, pods, round, i), image, corev1.RestartPolicyAlways, "sleep 3600")
			batch[i].Spec.NodeName = n.name
		}
		cpuBefore := sampleProc(t, n.kubelet.Cmd.Process.Pid).cpu
		uids, starts := createPods(t, cp, batch)
		ready := watch.wait(t, uids, 5*time.Minute)
		if round >= 0 {
			startCPU[side+"/"+strconv.Itoa(pods)] += sampleProc(t, n.kubelet.Cmd.Process.Pid).cpu - cpuBefore
		}
		for i := range uids {
			keep(ready[i].Sub(starts[i]))
		}
	}
	loads := map[int][]string{}
	for _, pods := range []int{1, 30} {
		r := rounds
		if pods > 1 {
			r = max(2, rounds/5)
		}
		// One warm-up round per side, left out.
		for _, s := range sides {
			runSide(s, pods, -1)
		}
		for _, n := range nodes {
			deletePods(t, cp, n.name, 3*time.Minute)
			waitRuntimeQuiet(t, n, 3*time.Minute)
		}
		for round := range r {
			for i := range sides {
				s := sides[(round+i)%len(sides)]
				if pods == 1 {
					runSide(s, pods, round)
				} else {
					before := len(lat[s][pods])
					runSide(s, pods, round)
					t.Logf("30 pods round %d %-10s: %s", round, s, latSummary(lat[s][pods][before:]))
				}
			}
			// Pods are removed with both kubelets at work, between rounds (untimed),
			// and the next round waits until the runtimes are quiet, so no side
			// starts pods while its own or the other's teardown still runs.
			var wg sync.WaitGroup
			for _, n := range nodes {
				wg.Add(1)
				go func() { defer wg.Done(); deletePods(t, cp, n.name, 3*time.Minute) }()
			}
			wg.Wait()
			for _, n := range nodes {
				waitRuntimeQuiet(t, n, 3*time.Minute)
			}
			// Removing the stopped sandboxes and containers follows.
			time.Sleep(2 * time.Second)
			loads[pods] = append(loads[pods], loadAvg(t))
		}
	}
	for _, pods := range []int{1, 30} {
		t.Logf("pod start, %d pod(s) at once; load averages after each round: %v", pods, loads[pods])
		for _, s := range sides {
			t.Logf("  %-10s %3d samples: %s", s, len(lat[s][pods]), latSummary(lat[s][pods]))
		}
		floor := percentile(lat["containerd"][pods], 0.5)
		for _, s := range sides[1:] {
			t.Logf("  %-10s p50 / containerd p50 = %.2f; p99 / containerd p99 = %.2f", s,
				float64(percentile(lat[s][pods], 0.5))/float64(floor),
				float64(percentile(lat[s][pods], 0.99))/float64(percentile(lat["containerd"][pods], 0.99)))
		}
		for _, s := range sides[1:] {
			n := len(lat[s][pods])
			t.Logf("  %-10s kubelet CPU while starting: %.1f ms per pod (%s over %d pods)", s,
				float64(startCPU[s+"/"+strconv.Itoa(pods)].Microseconds())/1000/float64(n), startCPU[s+"/"+strconv.Itoa(pods)], n)
		}
		lo, hi := ratioCI(lat["nodekit"][pods], lat["upstream"][pods], 0.5)
		t.Logf("  nodekit/upstream p50 %.2f (95%% bootstrap interval [%.2f, %.2f])",
			float64(percentile(lat["nodekit"][pods], 0.5))/float64(percentile(lat["upstream"][pods], 0.5)), lo, hi)
	}

	// Density: both nodes get the same pause pods at once; after they are all Ready
	// and a settling pause, each kubelet's CPU time over the idle window and its RSS.
	pids := map[string]int{}
	for _, n := range nodes {
		pids[n.name] = kubeletPID(t, n)
	}
	// The floors run with no pod through every step; they are sampled beside the
	// kubelets so their RSS can be read against the libraries' own: "floor" on the
	// clientset and k8s.io/apiserver as both kubelets are, "bare" on client-go's
	// REST client alone.
	floors := []*testenv.Process{
		startFloor(t, cp, nodes[0], "./internal/floor", "floor", 10260),
		startFloor(t, cp, nodes[0], "./internal/floor/bare", "bare", 10261),
	}
	floorNames := []string{"floor", "bare"}
	have := 0
	for _, target := range []int{0, 30, 110} {
		var uids []string
		var batch []*corev1.Pod
		for _, n := range nodes {
			for i := have; i < target; i++ {
				batch = append(batch, pausePod(fmt.Sprintf("idle-%s-%d", n.name, i), n.name, direct.ctd.PauseImage()))
			}
		}
		if len(batch) > 0 {
			var starts []time.Time
			uids, starts = createPods(t, cp, batch)
			ready := watch.wait(t, uids, 10*time.Minute)
			var last time.Duration
			for i := range ready {
				last = max(last, ready[i].Sub(starts[i]))
			}
			t.Logf("%d more pods on each node Ready within %s", target-have, last.Round(time.Millisecond))
		}
		have = target
		time.Sleep(20 * time.Second)
		before := map[string]procSample{}
		for _, n := range nodes {
			before[n.name] = sampleProc(t, pids[n.name])
		}
		floorBefore := make([]procSample, len(floors))
		for i, f := range floors {
			floorBefore[i] = sampleProc(t, f.Cmd.Process.Pid)
		}
		loadBefore := loadAvg(t)
		time.Sleep(idle)
		after := map[string]procSample{}
		floorAfter := make([]procSample, len(floors))
		for i, f := range floors {
			floorAfter[i] = sampleProc(t, f.Cmd.Process.Pid)
			select {
			case <-f.Exited():
				t.Fatalf("%s exited:\n%s", floorNames[i], f.Tail(4000))
			default:
			}
		}
		for _, n := range nodes {
			after[n.name] = sampleProc(t, pids[n.name])
			select {
			case <-n.kubelet.Exited():
				t.Fatalf("the %s kubelet exited:\n%s", n.name, n.kubelet.Tail(4000))
			default:
			}
		}
		if dir := os.Getenv("NODEKIT_BENCH_RESIDENT_DIR"); dir != "" {
			// Which sections and packages of each binary are resident, for
			// docs/benchmarks.md; a failure here is logged, not fatal.
			procs := map[string]int{"nodekit": pids["nodekit"], "upstream": pids["upstream"]}
			for i, f := range floors {
				procs[floorNames[i]] = f.Cmd.Process.Pid
			}
			for name, pid := range procs {
				out, err := exec.Command("python3", "../../hack/resident-sections.py", "--packages=40", strconv.Itoa(pid)).CombinedOutput()
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%dpods.txt", name, target)), out, 0o644)
				}
				if err != nil {
					t.Logf("resident sections of %s: %v\n%s", name, err, out)
				}
			}
		}
		cpu := map[string]time.Duration{}
		for _, n := range nodes {
			a, b := after[n.name], before[n.name]
			cpu[n.name] = a.cpu - b.cpu
			t.Logf("idle with %3d pods, %-8s: CPU %.2f s over %s (%.2f%% of a core), VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB, %d threads",
				target, n.name, cpu[n.name].Seconds(), a.at.Sub(b.at).Round(time.Second),
				100*cpu[n.name].Seconds()/a.at.Sub(b.at).Seconds(), float64(a.rss)/(1<<20), float64(a.anon)/(1<<20), float64(a.file)/(1<<20), float64(a.hwm)/(1<<20), a.threads)
		}
		if strings.Contains(os.Getenv("NODEKIT_BENCH_NODEKIT_ENV"), "gctrace=1") {
			// The collector's last line: live heap and goal, for comparing GC settings.
			lines := strings.Split(nodes[0].kubelet.Tail(200000), "\n")
			for i := len(lines) - 1; i >= 0; i-- {
				if strings.HasPrefix(lines[i], "gc ") {
					t.Logf("idle with %3d pods, nodekit's last GC: %s", target, lines[i])
					break
				}
			}
		}
		for i := range floors {
			fa, fb := floorAfter[i], floorBefore[i]
			t.Logf("idle, %-5s (no pod): CPU %.2f s, VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB, %d threads", floorNames[i],
				(fa.cpu - fb.cpu).Seconds(), float64(fa.rss)/(1<<20), float64(fa.anon)/(1<<20), float64(fa.file)/(1<<20), float64(fa.hwm)/(1<<20), fa.threads)
		}
		fa := floorAfter[0]
		t.Logf("idle with %3d pods: load %s -> %s; nodekit/upstream CPU %.2f, VmRSS %.2f (anon %.2f); floor/upstream VmRSS %.2f; nodekit above the floor %.1f MiB, upstream %.1f MiB",
			target, loadBefore, loadAvg(t),
			cpu["nodekit"].Seconds()/cpu["upstream"].Seconds(), float64(after["nodekit"].rss)/float64(after["upstream"].rss),
			float64(after["nodekit"].anon)/float64(after["upstream"].anon), float64(fa.rss)/float64(after["upstream"].rss),
			float64(after["nodekit"].rss-fa.rss)/(1<<20), float64(after["upstream"].rss-fa.rss)/(1<<20))
	}
}

// runDirect starts pods sandboxes with one busybox container each straight through
// CRI, at once, and returns each one's start latency; they are removed afterwards.
func (n *testNode) runDirect(t *testing.T, image string, pods int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, pods)
	ids := make([]string, pods)
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat[i], ids[i], errs[i] = n.startOneDirect(ctx, image, fmt.Sprintf("direct-%d", i))
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" {
			require.NoError(t, n.runtime.StopPodSandbox(ctx, id))
			require.NoError(t, n.runtime.RemovePodSandbox(ctx, id))
		}
	}
	for _, err := range errs {
		require.NoError(t, err)
	}
	return lat
}

func (n *testNode) startOneDirect(ctx context.Context, image, name string) (time.Duration, string, error) {
	pod := busyboxPod(name, image, corev1.RestartPolicyAlways, "sleep 3600")
	pod.UID = uuid.NewUUID()
	start := time.Now()
	sc, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: filepath.Join(n.dir, "direct-logs")})
	if err != nil {
		return 0, "", err
	}
	id, err := n.runtime.RunPodSandbox(ctx, sc, "")
	if err != nil {
		return 0, "", err
	}
	cc, err := cri.ContainerConfig(pod, "main", 0, image)
	if err != nil {
		return 0, id, err
	}
	cid, err := n.runtime.CreateContainer(ctx, id, cc, sc)
	if err != nil {
		return 0, id, err
	}
	if err := n.runtime.StartContainer(ctx, cid); err != nil {
		return 0, id, err
	}
	return time.Since(start), id, nil
}
