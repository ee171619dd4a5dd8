package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// BenchmarkVersusUpstream runs nodekit's kube-proxy and the real kube-proxy
// v1.37.2 side by side, both in nftables mode with upstream defaults, against one
// API server, each writing into its own network namespace. It measures the time
// from start to the first full sync in the kernel (each agent alone), then, with
// both running, the time from an EndpointSlice write to the new endpoint being in
// each kernel under a steady churn, and each agent's CPU seconds over the churn
// and peak RSS (VmHWM, reset as the churn starts, so it is the peak over the
// churn; the peak of everything before it, the first full sync included, is
// logged beside it). NODEKIT_BENCH_SERVICES (default 1000, 10 endpoints each),
// NODEKIT_BENCH_RATE (changes per second, default 20) and NODEKIT_BENCH_SECONDS
// (default 60) size it; NODEKIT_BENCH_MIN_SYNC_PERIOD (a duration) gives both
// agents --iptables-min-sync-period (the minSyncPeriod of every mode but ipvs)
// instead of the default 1s. It runs once whatever b.N is.
func BenchmarkVersusUpstream(b *testing.B) {
	testenv.RequireRoot(b)
	upstreamBin := testenv.PeerBinary(b, "kube-proxy")
	services := envInt("NODEKIT_BENCH_SERVICES", 1000)
	rate := envInt("NODEKIT_BENCH_RATE", 20)
	seconds := envInt("NODEKIT_BENCH_SECONDS", 60)
	minSync := time.Second
	var minSyncArgs []string
	if v := os.Getenv("NODEKIT_BENCH_MIN_SYNC_PERIOD"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err, "NODEKIT_BENCH_MIN_SYNC_PERIOD")
		minSync = d
		minSyncArgs = []string{"--iptables-min-sync-period=" + d.String()}
	}

	cp := controlplane.Start(b, controlplane.Options{})
	client := cp.AdminClient()
	ns := "bench"
	_, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(b, err)
	t0 := time.Now()
	eps := createServices(b, client, ns, services)
	b.Logf("created %d services with 10 endpoints each in %v", services, time.Since(t0))

	nk := newBenchNode(b, cp, "bench-nodekit", "nodekit")
	up := newBenchNode(b, cp, "bench-upstream", "upstream")

	// First full sync, each agent alone.
	nkMetrics := "127.0.0.1:" + freePort(b)
	nkArgs := []string{
		"--kubeconfig=" + writeKubeconfig(b, cp.AdminConfig()), "--hostname-override=" + nk.name,
		"--proxy-mode=nftables", "--netns=" + nk.env.Node.Path(), "--cluster-cidr=10.244.0.0/16",
		"--healthz-bind-address=127.0.0.1:" + freePort(b), "--metrics-bind-address=" + nkMetrics,
	}
	nkArgs = append(nkArgs, minSyncArgs...)
	profDir := os.Getenv("NODEKIT_BENCH_PROFILE")
	if profDir != "" {
		nkArgs = append(nkArgs, "--profiling", "-v=4")
		nk.logPath = filepath.Join(profDir, "nodekit.log")
	}
	nk.start(b, agentBin, nkArgs, false)
	nkFirst := nk.waitServices(b, services)
	if profDir != "" {
		fetchProfile(b, nkMetrics, "heap", filepath.Join(profDir, "heap-after-first-sync.pprof"))
	}
	relay := relayAPI(b, up.env.Node, cp.URL())
	upCfg := cp.AdminConfig()
	upCfg.Host = "https://" + relay
	up.start(b, upstreamBin, append([]string{
		"--kubeconfig=" + writeKubeconfig(b, upCfg), "--hostname-override=" + up.name,
		"--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "--conntrack-max-per-core=0",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
	}, minSyncArgs...), true)
	upFirst := up.waitServices(b, services)
	b.Logf("first full sync in the kernel at %d services: nodekit %v, kube-proxy %v", services, nkFirst, upFirst)

	// Churn with both running. The test's own watch on the EndpointSlices records
	// when each change is delivered, for the floor (see syncFloor).
	delivered := watchDeliveries(b, client, ns)
	if profDir != "" {
		go fetchProfile(b, nkMetrics, fmt.Sprintf("profile?seconds=%d", seconds), filepath.Join(profDir, "cpu-churn.pprof"))
	}
	nkCPU0, nkKids0 := nk.cpu(b)
	upCPU0, upKids0 := up.cpu(b)
	nkStartPeak, upStartPeak := nk.resetPeakRSS(b), up.resetPeakRSS(b)
	var mu sync.Mutex
	type change struct {
		svc int
		ip  netip.Addr
		at  time.Time
	}
	var pending []change
	nkLat, upLat := []time.Duration{}, []time.Duration{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	watch := func(n *benchNode, lat *[]time.Duration, seen map[netip.Addr]bool) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			mu.Lock()
			todo := slices.Clone(pending)
			mu.Unlock()
			var want []change
			for _, c := range todo {
				if !seen[c.ip] {
					want = append(want, c)
				}
			}
			if len(want) == 0 {
				continue
			}
			present := n.present(b, func(yield func(int, netip.Addr) bool) {
				for _, c := range want {
					if !yield(c.svc, c.ip) {
						return
					}
				}
			})
			now := time.Now()
			for _, c := range want {
				if present[c.ip] {
					seen[c.ip] = true
					*lat = append(*lat, now.Sub(c.at))
				}
			}
		}
	}
	wg.Add(2)
	go watch(nk, &nkLat, map[netip.Addr]bool{})
	go watch(up, &upLat, map[netip.Addr]bool{})
	var writes []change

	total := rate * seconds
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for i := range total {
		<-tick.C
		svc := (i * 7919) % services
		es := eps[svc]
		ip := netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})
		es.Endpoints[i%len(es.Endpoints)].Addresses = []string{ip.String()}
		at := time.Now()
		updated, err := client.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), es, metav1.UpdateOptions{})
		require.NoError(b, err)
		eps[svc] = updated
		mu.Lock()
		pending = append(pending, change{svc, ip, at})
		mu.Unlock()
		writes = append(writes, change{svc, ip, at})
	}
	tick.Stop()
	// Let the last changes land, then stop watching.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := len(nkLat) >= total && len(upLat) >= total
		mu.Unlock()
		if done {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	nkSelf, nkKids := nk.cpu(b)
	upSelf, upKids := up.cpu(b)
	nkSelf, nkKids, upSelf, upKids = nkSelf-nkCPU0, nkKids-nkKids0, upSelf-upCPU0, upKids-upKids0
	nkCPU, upCPU := nkSelf+nkKids, upSelf+upKids
	nkPeak, upPeak := nk.peakRSS(b), up.peakRSS(b)
	if profDir != "" {
		fetchProfile(b, nkMetrics, "heap", filepath.Join(profDir, "heap-after-churn.pprof"))
	}
	var watchLat, floorLat []time.Duration
	at := delivered()
	type arrival struct{ wrote, got time.Time }
	var arrivals []arrival
	for _, w := range writes {
		if t, ok := at[w.ip]; ok {
			watchLat = append(watchLat, t.Sub(w.at))
			arrivals = append(arrivals, arrival{w.at, t})
		}
	}
	slices.SortFunc(arrivals, func(a, b arrival) int { return a.got.Compare(b.got) })
	times := make([]time.Time, len(arrivals))
	for i, a := range arrivals {
		times[i] = a.got
	}
	for i, t := range syncFloor(times, minSync, 0) {
		floorLat = append(floorLat, t.Sub(arrivals[i].wrote))
	}
	// The kernel's own floor: each agent stopped (its rules stay), the commit of
	// the smallest change that makes the kernel validate the table, timed in both
	// tables, then the same simulation with every sync taking that long.
	nk.stop(b)
	up.stop(b)
	nkCommit, nkPlain := nk.commitFloor(b, 30)
	upCommit, upPlain := up.commitFloor(b, 30)
	commit := min(nkCommit, upCommit)
	var kernelLat []time.Duration
	for i, t := range syncFloor(times, minSync, commit) {
		kernelLat = append(kernelLat, t.Sub(arrivals[i].wrote))
	}
	p := func(l []time.Duration, q float64) time.Duration {
		if len(l) == 0 {
			return 0
		}
		s := slices.Clone(l)
		slices.Sort(s)
		return s[int(q*float64(len(s)-1))]
	}
	b.Logf("churn %d changes/s for %ds at %d services (API write to element in the kernel):", rate, seconds, services)
	b.Logf("  nodekit:    seen %d/%d p50 %v p99 %v cpu %.2fs (itself %.2fs, children %.2fs) peak RSS over the churn %d MiB (before it, first full sync included: %d MiB)", len(nkLat), total, p(nkLat, .5), p(nkLat, .99), nkCPU, nkSelf, nkKids, nkPeak>>20, nkStartPeak>>20)
	b.Logf("  kube-proxy: seen %d/%d p50 %v p99 %v cpu %.2fs (itself %.2fs, children %.2fs) peak RSS over the churn %d MiB (before it, first full sync included: %d MiB)", len(upLat), total, p(upLat, .5), p(upLat, .99), upCPU, upSelf, upKids, upPeak>>20, upStartPeak>>20)
	b.Logf("  floor (API write to the watch delivering it, then to the sync a %v minSyncPeriod allows, syncs taking no time): seen %d/%d watch p50 %v p99 %v, floor p50 %v p99 %v",
		minSync, len(watchLat), total, p(watchLat, .5), p(watchLat, .99), p(floorLat, .5), p(floorLat, .99))
	b.Logf("  kernel floor: one commit that adds a jump (the table validated) median %v in nodekit's table, %v in kube-proxy's (one without a jump: %v, %v); with every sync taking %v: floor p50 %v p99 %v",
		nkCommit, upCommit, nkPlain, upPlain, commit, p(kernelLat, .5), p(kernelLat, .99))
	b.ReportMetric(p(floorLat, .5).Seconds(), "floor-p50-s")
	b.ReportMetric(p(kernelLat, .5).Seconds(), "kernel-floor-p50-s")
	b.ReportMetric(nkFirst.Seconds(), "nodekit-first-sync-s")
	b.ReportMetric(upFirst.Seconds(), "kube-proxy-first-sync-s")
	b.ReportMetric(p(nkLat, .5).Seconds(), "nodekit-p50-s")
	b.ReportMetric(p(upLat, .5).Seconds(), "kube-proxy-p50-s")
	b.ReportMetric(p(nkLat, .99).Seconds(), "nodekit-p99-s")
	b.ReportMetric(p(upLat, .99).Seconds(), "kube-proxy-p99-s")
	b.ReportMetric(nkCPU, "nodekit-cpu-s")
	b.ReportMetric(upCPU, "kube-proxy-cpu-s")
	b.ReportMetric(float64(nkPeak>>20), "nodekit-churn-peak-rss-MiB")
	b.ReportMetric(float64(upPeak>>20), "kube-proxy-churn-peak-rss-MiB")
	b.ReportMetric(float64(nkStartPeak>>20), "nodekit-start-peak-rss-MiB")
	b.ReportMetric(float64(upStartPeak>>20), "kube-proxy-start-peak-rss-MiB")
}

// watchDeliveries watches the namespace's EndpointSlices from the test process
// and returns a function giving, per endpoint address, when a watch event first
// carried it.
func watchDeliveries(b *testing.B, client kubernetes.Interface, ns string) func() map[netip.Addr]time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	list, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	w, err := client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(b, err)
	var mu sync.Mutex
	seen := map[netip.Addr]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			now := time.Now()
			mu.Lock()
			for _, e := range es.Endpoints {
				for _, a := range e.Addresses {
					if ip, err := netip.ParseAddr(a); err == nil {
						if _, ok := seen[ip]; !ok {
							seen[ip] = now
						}
					}
				}
			}
			mu.Unlock()
		}
	}()
	return func() map[netip.Addr]time.Time {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// syncFloor is the earliest each change can be in the kernel under upstream's
// BoundedFrequencyRunner (pkg/proxy/runner) with the given minSyncPeriod if every
// sync took cost: delivered (ascending) are the times the changes reach the agent;
// a sync starts as soon as one is queued, but no sooner than min after the
// previous one completed, and takes every change delivered by its start.
func syncFloor(delivered []time.Time, min, cost time.Duration) []time.Time {
	out := make([]time.Time, len(delivered))
	var start, end time.Time // of the last sync
	for i, d := range delivered {
		if i > 0 && !d.After(start) {
			out[i] = end // taken by the last sync
			continue
		}
		s := d
		if i > 0 {
			if t := end.Add(min); t.After(s) {
				s = t
			}
		}
		start, end = s, s.Add(cost)
		out[i] = end
	}
	return out
}

// fetchProfile saves one /debug/pprof/ profile of the agent.
func fetchProfile(b *testing.B, addr, what, path string) {
	resp, err := http.Get("http://" + addr + "/debug/pprof/" + what)
	if err != nil {
		b.Logf("profile %s: %v", what, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, data)
	}
	if err == nil {
		err = os.WriteFile(path, data, 0o644)
	}
	if err != nil {
		b.Logf("profile %s: %v", what, err)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func freePort(tb testing.TB) string {
	ports, err := testenv.FreePorts(1)
	require.NoError(tb, err)
	return strconv.Itoa(ports[0])
}

// createServices makes n selector-less Services, each with one EndpointSlice of
// 10 ready endpoints, and returns the slices.
func createServices(tb testing.TB, client kubernetes.Interface, ns string, n int) []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("svc-%05d", i)
				ctx := context.Background()
				_, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
					Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}},
				}, metav1.CreateOptions{})
				if err != nil {
					errs <- err
					continue
				}
				es := &discoveryv1.EndpointSlice{
					ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Ports:       []discoveryv1.EndpointPort{{Name: new("p"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
				}
				for j := range 10 {
					es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
						Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+j, i/256%256, i%256)},
					})
				}
				created, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
				if err != nil {
					errs <- err
					continue
				}
				out[i] = created
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
	return out
}

// benchNode is one agent writing into its own network-namespace node.
type benchNode struct {
	name, kind string
	env        *netns.Env
	cmd        *exec.Cmd
	started    time.Time
	// logPath keeps the agent's log there instead of in a temporary directory.
	logPath string
	// chains caches the service chains by Service name (see present).
	chains map[string]*nftables.Chain
}

func newBenchNode(b *testing.B, cp *controlplane.ControlPlane, name, kind string) *benchNode {
	n := &benchNode{name: name, kind: kind, env: netns.New(b, netns.Config{Pods: 1})}
	cp.CreateNode(b, name)
	client := cp.AdminClient()
	require.NoError(b, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.env.NodeIP.String()}}
		_, err = client.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{})
		return err
	}))
	return n
}

// start runs the agent; inNS starts it inside the node namespace (the upstream
// binary has no --netns).
func (n *benchNode) start(b *testing.B, bin string, args []string, inNS bool) {
	path := n.logPath
	if path == "" {
		path = filepath.Join(b.TempDir(), n.kind+".log")
	}
	log, err := os.Create(path)
	require.NoError(b, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	n.started = time.Now()
	if inNS {
		require.NoError(b, n.env.Node.Start(cmd))
	} else {
		require.NoError(b, cmd.Start())
	}
	n.cmd = cmd
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
	})
}

func (n *benchNode) conn(b *testing.B) *nftables.Conn {
	c, err := nftables.New(nftables.WithNetNSFd(n.env.Node.FD()))
	require.NoError(b, err)
	return c
}

// waitServices waits until the kernel's service-ips map holds services entries
// and returns the time since start.
func (n *benchNode) waitServices(b *testing.B, services int) time.Duration {
	c := n.conn(b)
	defer c.CloseLasting()
	table := &nftables.Table{Name: "kube-proxy", Family: nftables.TableFamilyIPv4}
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		if set, err := c.GetSetByName(table, "service-ips"); err == nil {
			if elems, err := c.GetSetElements(set); err == nil && len(elems) >= services {
				return time.Since(n.started)
			}
		}
		if n.cmd.ProcessState != nil {
			b.Fatalf("%s exited", n.kind)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("%s: no full sync in 10 minutes", n.kind)
	return 0
}

// present reports which of the wanted endpoint addresses the kernel steers to,
// from the service's chain: nodekit DNATs to each endpoint in a rule of its own,
// kube-proxy through an anonymous map the chain's rule looks up. Endpoint changes
// keep a service's chain (only its rules change), so the chains are listed once
// and again only when one is missing or cannot be read: listing 10,000 chains
// every 20 ms would cost both agents CPU and add to what is measured.
func (n *benchNode) present(b *testing.B, want func(func(int, netip.Addr) bool)) map[netip.Addr]bool {
	c := n.conn(b)
	defer c.CloseLasting()
	out := map[netip.Addr]bool{}
	debug := os.Getenv("NODEKIT_BENCH_DEBUG") != ""
	relist := n.chains == nil
	want(func(svc int, ip netip.Addr) bool {
		name := fmt.Sprintf("svc-%05d", svc)
		for attempt := 0; attempt < 2; attempt++ {
			if relist {
				relist = false
				chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
				if err != nil {
					if debug {
						b.Logf("%s: listing chains: %v", n.kind, err)
					}
					return true
				}
				n.chains = map[string]*nftables.Chain{}
				for _, ch := range chains {
					if strings.HasPrefix(ch.Name, "service-") {
						if i := strings.Index(ch.Name, "/svc-"); i >= 0 {
							n.chains[ch.Name[i+1:i+10]] = ch
						}
					}
				}
			}
			ch := n.chains[name]
			if ch == nil {
				relist = attempt == 0
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				relist = attempt == 0
				continue
			}
			if n.steers(c, ch, rules, ip) {
				out[ip] = true
			}
			return true
		}
		return true
	})
	return out
}

// steers reports whether one of a service chain's rules DNATs to ip.
func (n *benchNode) steers(c *nftables.Conn, ch *nftables.Chain, rules []*nftables.Rule, ip netip.Addr) bool {
	raw := ip.AsSlice()
	for _, r := range rules {
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Immediate: // nodekit: one dnat rule per endpoint
				if bytes.Equal(e.Data, raw) {
					return true
				}
			case *expr.Lookup: // kube-proxy: dnat to numgen ... map { i : ip . port }
				set := &nftables.Set{Table: ch.Table, Name: e.SetName, ID: e.SetID, Anonymous: true}
				elems, err := c.GetSetElements(set)
				if err != nil {
					continue
				}
				for _, el := range elems {
					if bytes.Contains(el.Val, raw) || bytes.HasPrefix(el.Key, raw) {
						return true
					}
				}
			}
		}
	}
	return false
}

// cpu is the user+system CPU seconds so far of the process itself and of the
// children it waited for: kube-proxy runs `nft -f -` for every sync, and the
// kernel work of committing the batch is charged to nft there, to the agent
// itself in nodekit (which writes through netlink).
func (n *benchNode) cpu(b *testing.B) (self, children float64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
	require.NoError(b, err)
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	v := func(i int) float64 {
		x, _ := strconv.ParseFloat(f[i], 64)
		return x / 100 // USER_HZ
	}
	return v(11) + v(12), v(13) + v(14) // utime+stime, cutime+cstime
}

// stop ends the agent (SIGTERM; both leave their rules in the kernel) and waits
// for it to exit.
func (n *benchNode) stop(b *testing.B) {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
	}
}

// commitFloor times, rounds times, the kernel's commit of the smallest change
// that makes it validate the agent's whole table: one rule jumping to a service
// chain, added to a chain of the bench's own that nothing jumps to (any new rule
// or verdict-map element that jumps marks the table for validation, and the
// kernel then walks every chain reachable from the base chains). plain is the
// same commit with a rule that only counts, which needs no validation. Medians.
// The agent must be stopped: its next sync would remove the bench's chain.
func (n *benchNode) commitFloor(b *testing.B, rounds int) (jump, plain time.Duration) {
	c := n.conn(b)
	defer c.CloseLasting()
	table := &nftables.Table{Name: "kube-proxy", Family: nftables.TableFamilyIPv4}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	require.NoError(b, err)
	target := ""
	for _, ch := range chains {
		if ch.Table.Name == table.Name && strings.HasPrefix(ch.Name, "service-") {
			target = ch.Name
			break
		}
	}
	require.NotEmpty(b, target, "%s: no service chain in the table", n.kind)
	floor := c.AddChain(&nftables.Chain{Name: "bench-commit-floor", Table: table})
	require.NoError(b, c.Flush())
	defer func() {
		c.DelChain(floor)
		_ = c.Flush()
	}()
	timeOne := func(e expr.Any) time.Duration {
		c.AddRule(&nftables.Rule{Table: table, Chain: floor, Exprs: []expr.Any{e}})
		t0 := time.Now()
		require.NoError(b, c.Flush())
		d := time.Since(t0)
		c.FlushChain(floor)
		require.NoError(b, c.Flush())
		return d
	}
	var jumps, plains []time.Duration
	for range rounds {
		jumps = append(jumps, timeOne(&expr.Verdict{Kind: expr.VerdictJump, Chain: target}))
		plains = append(plains, timeOne(&expr.Counter{}))
	}
	slices.Sort(jumps)
	slices.Sort(plains)
	return jumps[len(jumps)/2], plains[len(plains)/2]
}

// resetPeakRSS returns VmHWM in bytes and resets it to the current RSS (writing 5
// to /proc/PID/clear_refs, Linux 4.0 and later), so the next peakRSS is the peak
// since this call.
func (n *benchNode) resetPeakRSS(b *testing.B) int64 {
	peak := n.peakRSS(b)
	require.NoError(b, os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", n.cmd.Process.Pid), []byte("5"), 0))
	return peak
}

// peakRSS is VmHWM in bytes.
func (n *benchNode) peakRSS(b *testing.B) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	require.NoError(b, err)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// relayAPI listens on 127.0.0.1 inside ns and relays to the API server on the
// machine's loopback, so an agent living in ns (upstream kube-proxy has no
// --netns) reaches it. Only sockets cross: no route or address is added
// anywhere.
func relayAPI(b *testing.B, ns *netns.Namespace, apiURL string) string {
	target := strings.TrimPrefix(apiURL, "https://")
	var ln net.Listener
	require.NoError(b, ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}))
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

func TestSyncFloor(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	delivered := []time.Time{at(0), at(100), at(1200), at(1300), at(5000)}
	// minSyncPeriod 1s, syncs of 200ms: the first change syncs at once; the second
	// waits for 1s after the first sync completed (1.2s) and is in at 1.4s; the
	// third arrived at the second sync's start and rides it; the fourth waits for
	// 1s after that sync completed; the last finds the runner idle.
	want := []time.Time{at(200), at(1400), at(1400), at(2600), at(5200)}
	require.Equal(t, want, syncFloor(delivered, time.Second, 200*time.Millisecond))
	// Syncs that take no time: each change waits for the next allowed sync only.
	want = []time.Time{at(0), at(1000), at(2000), at(2000), at(5000)}
	require.Equal(t, want, syncFloor(delivered, time.Second, 0))
}
