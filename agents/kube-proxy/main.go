// Command kube-proxy is nodekit's reference kube-proxy: it watches Services and
// EndpointSlices and writes kube-proxy's nftables (default) or iptables rules,
// then steps back. It takes upstream kube-proxy's flags and configuration file;
// see docs/kube-proxy.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/servicemap"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	logs.InitLogs()
	defer logs.FlushLogs()
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	o := newOptions()
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logger := klog.Background()
	if err := o.complete(fs, logger); err != nil {
		fmt.Fprintf(os.Stderr, "kube-proxy: %v\n", err)
		return 1
	}
	if err := logsapi.ValidateAndApply(&o.cfg.Logging, nil); err != nil {
		fmt.Fprintf(os.Stderr, "kube-proxy: %v\n", err)
		return 1
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, logger)
	// Upstream's Run: the other modes' leftover rules go before anything else
	// starts. With --cleanup that is all; otherwise a failure is ignored, as
	// upstream's best-effort cleanup (the writers logged what failed).
	cleanupErr := platformCleanup(ctx, o)
	if o.cleanupAndExit {
		if cleanupErr != nil {
			logger.Error(cleanupErr, "Error running ProxyServer")
			return 1
		}
		return 0
	}
	if err := runAgent(ctx, o); err != nil {
		logger.Error(err, "Error running ProxyServer")
		return 1
	}
	return 0
}

// defaultGCPercent is the garbage collector's target unless GOGC is set. Most of
// the agent's heap is long-lived (the informer caches, the service map, the
// compiled rules), and it allocates little between full syncs, so collecting at
// a quarter of the live heap instead of Go's default of all of it costs little
// CPU and keeps the peak memory near the live size (measured in
// docs/benchmarks.md).
const defaultGCPercent = 25

// fullSyncGCPercent is the garbage collector's target while a full sync plans and
// writes, unless GOGC is set (0: left alone). A full sync at scale holds its
// netlink batch (streamed into as it is planned) for a moment, tens of MB that are
// garbage right after; a lower target keeps the collector's headroom over that peak small,
// at the cost of more collections during full syncs only (docs/benchmarks.md).
func fullSyncGCPercent() int {
	if os.Getenv("GOGC") != "" {
		return 0
	}
	return 10
}

// runAgent runs the proxy until ctx ends.
func runAgent(ctx context.Context, o *options) error {
	logger := klog.FromContext(ctx)
	cfg := o.cfg
	for _, f := range unhonoured(cfg) {
		logger.Info("Configuration field is not honoured by nodekit's kube-proxy", "field", f)
	}
	nodeName := cfg.HostnameOverride
	if nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
		nodeName = strings.ToLower(strings.TrimSpace(h))
	}
	syncPeriod, minSyncPeriod := syncPeriods(cfg)
	logger.Info("Using nodekit kube-proxy", "mode", cfg.Mode, "node", nodeName, "netns", o.netns,
		"syncPeriod", syncPeriod, "minSyncPeriod", minSyncPeriod)

	client, err := newClient(o)
	if err != nil {
		return err
	}
	registerMetrics()

	// Shutdown order (defers run last first): cancel, wait for every goroutine,
	// then release the namespace thread they may have been using.
	var ns *nsRunner
	defer func() {
		if ns != nil {
			ns.Close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	errCh := make(chan error, 8)
	// A part that fails ends the agent, even while it is still starting (upstream
	// runs its parts beside the loop that waits for their errors): the error is
	// queued and ctx cancelled, so a start-up step waiting on ctx returns.
	goRun := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				errCh <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	// stopped is what the agent returns once ctx has ended: a part's error, or
	// nil for a signal.
	stopped := func() error {
		select {
		case err := <-errCh:
			return err
		default:
			logger.Info("Shutting down; the rules stay in the kernel")
			return nil
		}
	}

	if o.configFile != "" {
		cw, err := newConfigWatcher(o.configFile)
		if err != nil {
			return err
		}
		goRun("config file watcher", cw.run)
	}

	// Where the rules live.
	do := func(fn func() error) error { return fn() }
	if o.netns != "" {
		var err error
		if ns, err = startNSRunner(o.netns); err != nil {
			return err
		}
		do = ns.Do
	}

	nm := newNodeWatch(client, nodeName, cfg.ConfigSyncPeriod.Duration)
	goRun("node informer", nm.run)
	health := newHealthServer(clock.RealClock{}, 2*syncPeriod, nm.get)
	recorder, stopEvents, err := startEvents(ctx, client)
	if err != nil {
		return err
	}
	defer stopEvents()
	// A server that cannot start ends the agent, with upstream's event.
	serve := func(what, reason, addr string, h http.Handler) func(context.Context) error {
		return func(ctx context.Context) error {
			err := serveHTTP(ctx, logger, what, addr, h)
			if err != nil && ctx.Err() == nil {
				recorder.Eventf(nodeRef(nodeName), nil, v1.EventTypeWarning, reason, "StartKubeProxy", err.Error())
			}
			return err
		}
	}
	if cfg.HealthzBindAddress != "" {
		goRun("healthz server", serve("healthz", "FailedToStartProxierHealthcheck", cfg.HealthzBindAddress, health.handler()))
	}
	goRun("metrics server", serve("metrics", "FailedToStartMetricServer", cfg.MetricsBindAddress, metricsHandler(string(cfg.Mode), cfg.EnableProfiling)))
	nm.mu.Lock()
	nm.onIPsChanged = func(old, new []string) {
		logger.Info("NodeIPs changed for the node", "node", klog.KRef("", nodeName), "newNodeIPs", new, "oldNodeIPs", old)
		errCh <- fmt.Errorf("node %s IPs changed from %v to %v: restart to use them", nodeName, old, new)
	}
	nm.mu.Unlock()
	node := nm.waitForIPs(ctx, logger, 30*time.Second)
	if ctx.Err() != nil {
		return stopped()
	}

	families, hcIPs, err := newSyncers(ctx, cfg, node, do)
	if err != nil {
		return err
	}
	for i := range families {
		sh := newServiceHealth(families[i].Family, hcIPs[i], listenIn(do), func() bool { return health.health().Healthy })
		sh.recorder, sh.nodeName = recorder, nodeName
		families[i].ServiceHealth = sh
	}

	tracker := servicemap.NewTracker(servicemap.Config{Logger: logger, Metrics: trackerMetrics{}})
	smNode := servicemap.Node{Name: nodeName}
	if node != nil {
		smNode.Labels = node.Labels
	}
	px := newProxier(proxierConfig{
		Tracker: tracker, Families: families, Do: do,
		Clock: clock.RealClock{}, MinSyncPeriod: minSyncPeriod, SyncPeriod: syncPeriod,
		Node: smNode, Health: health,
		FullSyncGCPercent: fullSyncGCPercent(),
	})
	nm.mu.Lock()
	nm.onChange = px.OnNodeChange
	nm.mu.Unlock()

	watcher, err := servicemap.NewWatcher(servicemap.WatcherConfig{
		Client: client, Handler: px, ResyncPeriod: cfg.ConfigSyncPeriod.Duration,
	})
	if err != nil {
		return err
	}

	goRun("service watcher", watcher.Run)
	if cfg.Mode != modeIPTables {
		// Upstream's iptables proxier ignores ServiceCIDRs; nftables drops
		// traffic to their unallocated addresses.
		cidrs := newServiceCIDRWatch(client, cfg.ConfigSyncPeriod.Duration, func(c []netip.Prefix) {
			px.OnServiceCIDRsChanged(logger, c)
		})
		goRun("serviceCIDR watcher", cidrs.run)
	}
	goRun("sync loop", func(ctx context.Context) error {
		err := px.Run(ctx)
		for _, f := range families {
			f.ServiceHealth.Close() // no sync can reopen them now
		}
		return err
	})
	// Upstream's birth cry, once the watches are started.
	recorder.Eventf(nodeRef(nodeName), nil, v1.EventTypeNormal, "Starting", "StartKubeProxy", "")
	go func() {
		select {
		case <-watcher.Synced():
			logger.Info("Services and EndpointSlices synced; starting rule syncs")
			px.OnSynced()
		case <-ctx.Done():
		}
	}()

	select {
	case <-ctx.Done():
		return stopped()
	case err := <-errCh:
		return err
	}
}

func newClient(o *options) (kubernetes.Interface, error) {
	cc := o.cfg.ClientConnection
	if cc.Kubeconfig == "" && o.master == "" {
		klog.Background().Info("Neither kubeconfig file nor master URL was specified, falling back to in-cluster config")
	}
	restCfg, err := clientcmd.BuildConfigFromFlags(o.master, cc.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	restCfg.AcceptContentTypes = cc.AcceptContentTypes
	restCfg.ContentType = cc.ContentType
	restCfg.QPS = cc.QPS
	restCfg.Burst = int(cc.Burst)
	restCfg.UserAgent = "kube-proxy (nodekit)"
	return kubernetes.NewForConfig(restCfg)
}

// newSyncers builds one rules writer per IP family the host supports, inside the
// node's namespace, primary family first: upstream's platformCheckSupported and
// createProxier, which make a dual-stack MetaProxier whenever both families are
// usable. The primary family comes from a specific bindAddress, else the Node's
// first address, else IPv4. A secondary family the kernel (or ip6tables) lacks
// is skipped with upstream's log line; a missing primary family is an error. It
// also returns, for each writer, the node addresses of its family that health
// check ports answer on (its NodePort addresses); nil means every address of the
// family.
func newSyncers(ctx context.Context, cfg *v1alpha1.KubeProxyConfiguration, node *v1.Node, do func(func() error) error) ([]familySyncer, [][]netip.Addr, error) {
	logger := klog.FromContext(ctx)
	primary := primaryFamily(cfg, node)
	families := []v1.IPFamily{primary, otherFamily(primary)}
	var (
		out      []familySyncer
		hcAddrs  [][]netip.Addr
		failures = map[v1.IPFamily]error{}
	)
	err := do(func() error {
		ipv6Kernel := kernelHasIPv6(logger)
		for _, f := range families {
			if f == v1.IPv6Protocol && !ipv6Kernel {
				failures[f] = errors.New("no kernel support")
				continue
			}
			w, addrs, err := newFamilySyncer(ctx, cfg, node, f)
			if err != nil {
				if cfg.Mode == modeIPTables {
					logger.Info("No iptables support for family", "ipFamily", f, "error", err)
				} else {
					logger.Info("No nftables support for family", "ipFamily", f, "error", err)
				}
				failures[f] = err
				continue
			}
			out = append(out, familySyncer{Family: f, Syncer: w, Conntrack: rules.NewConntrackCleaner(nil)})
			hcAddrs = append(hcAddrs, addrs)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if err := failures[primary]; err != nil {
		return nil, nil, fmt.Errorf("no support for primary IP family %q: %w", primary, err)
	}
	if len(out) == 2 {
		logger.Info("kube-proxy running in dual-stack mode", "primary ipFamily", primary)
	} else {
		logger.Info("kube-proxy running in single-stack mode", "ipFamily", primary)
	}
	return out, hcAddrs, nil
}

// newFamilySyncer builds one family's writer for the mode, with that family's
// cluster CIDR, node IP and NodePort addresses. It runs in the node's namespace.
func newFamilySyncer(ctx context.Context, cfg *v1alpha1.KubeProxyConfiguration, node *v1.Node, f v1.IPFamily) (rules.Syncer, []netip.Addr, error) {
	bit, all := masquerade(cfg)
	mark := uint32(1) << uint(bit)
	cidr := clusterCIDRFor(cfg, f)
	// Upstream's nodeIP: a load-balancer source range holding it admits the
	// load-balancer IPs themselves as sources.
	nodeIP := nodeIPFor(cfg, node, f)
	metrics := rulesMetrics{family: string(f)}
	if cfg.Mode == modeIPTables {
		localhost := localhostNodePorts(cfg, node, f)
		if localhost {
			klog.FromContext(ctx).Info("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses", "ipFamily", f)
			if err := ensureSysctl(klog.FromContext(ctx), sysctlRouteLocalnet, 1); err != nil {
				return nil, nil, err
			}
		}
		w, err := rules.NewIPTables(ctx, rules.IPTablesConfig{Family: rulesFamily(f),
			MasqueradeMark: mark, ClusterCIDR: cidr, MasqueradeAll: all, NodeIP: nodeIP, Metrics: metrics,
			LocalhostNodePorts: localhost,
		})
		return w, nil, err
	}
	addrs, err := nodePortAddresses(klog.FromContext(ctx), cfg, node, f)
	if err != nil {
		return nil, nil, err
	}
	w, err := rules.NewNFTables(rules.NFTablesConfig{Family: rulesFamily(f),
		MasqueradeMark: mark, ClusterCIDR: cidr, MasqueradeAll: all,
		NodePortAddresses: addrs, NodeIP: nodeIP, Metrics: metrics,
	})
	return w, addrs, err
}

// kernelHasIPv6 is upstream's check, for the calling thread's network namespace:
// the kernel lists IPv6 interfaces and IPv6 is not disabled.
func kernelHasIPv6(logger klog.Logger) bool {
	if _, err := os.Stat("/proc/thread-self/net/if_inet6"); err != nil {
		logger.Info("No kernel support for family", "ipFamily", v1.IPv6Protocol)
		return false
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err == nil && strings.TrimSpace(string(b)) == "1" {
		logger.Info("Kernel support disabled for family", "ipFamily", v1.IPv6Protocol)
		return false
	}
	return true
}

// primaryFamily is upstream's detectNodeIPs choice: a specific bindAddress's
// family, else the family of the Node's first host IP, else IPv4.
func primaryFamily(cfg *v1alpha1.KubeProxyConfiguration, node *v1.Node) v1.IPFamily {
	if a, err := netip.ParseAddr(cfg.BindAddress); err == nil && !a.IsUnspecified() {
		return familyOf(a)
	}
	if node != nil {
		if ips := hostIPs(node); len(ips) > 0 {
			if a, err := netip.ParseAddr(ips[0]); err == nil {
				return familyOf(a)
			}
		}
	}
	return v1.IPv4Protocol
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

func otherFamily(f v1.IPFamily) v1.IPFamily {
	if f == v1.IPv4Protocol {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// nodePortAddresses resolves --nodeport-addresses to the node's addresses of one
// family the nftables rules accept NodePorts on. It runs in the node's namespace.
// Empty means every local address (the rules package's default, upstream's 'all').
func nodePortAddresses(logger klog.Logger, cfg *v1alpha1.KubeProxyConfiguration, node *v1.Node, family v1.IPFamily) ([]netip.Addr, error) {
	var prefixes []netip.Prefix
	var out []netip.Addr
	for _, a := range cfg.NodePortAddresses {
		switch a {
		case nodePortAddressesAll:
			return nil, nil
		case nodePortAddressesLocalhost:
			// Not supported in nftables mode by upstream without a feature gate.
		case nodePortAddressesPrimary:
			ip := nodeIPFor(cfg, node, family)
			if !ip.IsValid() {
				logger.Info("Can't determine this node's primary address of the family; accepting NodePorts on every local address",
					"ipFamily", family, "nodePortAddresses", cfg.NodePortAddresses)
				return nil, nil
			}
			out = append(out, ip)
		default:
			p, err := netip.ParsePrefix(a)
			if err != nil {
				return nil, fmt.Errorf("%w: nodePortAddresses %q: %w", errInvalidConfig, a, err)
			}
			if isFamily(p.Addr(), family) {
				prefixes = append(prefixes, p.Masked())
			}
		}
	}
	if len(prefixes) > 0 {
		ifAddrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("listing local addresses: %w", err)
		}
		for _, ia := range ifAddrs {
			ipn, ok := ia.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			for _, p := range prefixes {
				if p.Contains(ip) && !ip.IsLoopback() {
					out = append(out, ip)
					break
				}
			}
		}
		if len(out) == 0 {
			logger.Info("No local address matches nodePortAddresses; NodePorts are accepted nowhere", "ipFamily", family, "nodePortAddresses", cfg.NodePortAddresses)
			// The rules package reads an empty list as "everywhere"; an address
			// nothing uses keeps NodePorts closed.
			none := netip.IPv4Unspecified()
			if family == v1.IPv6Protocol {
				none = netip.IPv6Unspecified()
			}
			out = append(out, none)
		}
	}
	// No entry of this family (a dual-stack node configured with IPv4 CIDRs only):
	// every local address of the family, as upstream's NodePortAddresses.
	return out, nil
}

// nodeIPFor is upstream's node IP of one family: a specific bindAddress of that
// family, else the Node's host IP of that family (the first InternalIP, else
// ExternalIP, of the family). Zero when there is none.
func nodeIPFor(cfg *v1alpha1.KubeProxyConfiguration, node *v1.Node, family v1.IPFamily) netip.Addr {
	if a, err := netip.ParseAddr(cfg.BindAddress); err == nil && !a.IsUnspecified() && isFamily(a.Unmap(), family) {
		return a.Unmap()
	}
	if node == nil {
		return netip.Addr{}
	}
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != t {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && isFamily(ip.Unmap(), family) {
				return ip.Unmap()
			}
		}
	}
	return netip.Addr{}
}

// metricsHandler serves /metrics and /proxyMode and, with enableProfiling, the Go
// profiles under /debug/pprof/ as upstream's metrics server does (upstream
// installs the same net/http/pprof handlers through k8s.io/apiserver's routes).
func metricsHandler(mode string, profiling bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = fmt.Fprint(w, mode)
	})
	mux.Handle("/metrics", legacyregistry.Handler())
	if profiling {
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusFound))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// serveHTTP serves h on addr until ctx ends.
func serveHTTP(ctx context.Context, logger klog.Logger, what, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to start %s server on %s: %w", what, addr, err)
	}
	logger.V(3).Info("Starting HTTP server", "server", what, "address", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// nodeWatch watches this node's Node object (upstream's NodeManager).
type nodeWatch struct {
	informer cache.SharedIndexInformer
	name     string
	onChange func(*v1.Node)

	// onIPsChanged is called, once, when the Node's host IPs differ from those
	// seen at start; upstream exits so it restarts with the new addresses.
	onIPsChanged func(old, new []string)

	mu      sync.Mutex
	node    *v1.Node
	ips     []string
	ipsSet  bool
	ipsGone bool
}

// hostIPs is upstream's utilnode.GetNodeHostIPs: the InternalIPs then the
// ExternalIPs in order; the first of them, then the first of the other family.
func hostIPs(n *v1.Node) []string {
	var all []netip.Addr
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == t {
				all = append(all, ip.Unmap())
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	out := []string{all[0].String()}
	for _, ip := range all[1:] {
		if ip.Is4() != all[0].Is4() {
			out = append(out, ip.String())
			break
		}
	}
	return out
}

func newNodeWatch(client kubernetes.Interface, name string, resync time.Duration) *nodeWatch {
	// One informer of the Node, not a SharedInformerFactory: the factory links
	// the informers and listers of every API group into the binary.
	inf := coreinformers.NewFilteredNodeInformer(client, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
	nw := &nodeWatch{name: name, informer: inf}
	set := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok {
			return
		}
		nw.mu.Lock()
		nw.node = n
		cb := nw.onChange
		var changed func(old, new []string)
		ips := hostIPs(n)
		oldIPs := nw.ips
		if nw.ipsSet && !nw.ipsGone && !slices.Equal(ips, nw.ips) {
			nw.ipsGone = true
			changed = nw.onIPsChanged
		}
		nw.mu.Unlock()
		if cb != nil {
			cb(n)
		}
		if changed != nil {
			changed(oldIPs, ips)
		}
	}
	_, _ = nw.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, n any) { set(n) },
		DeleteFunc: func(any) {
			nw.mu.Lock()
			nw.node = nil
			nw.mu.Unlock()
		},
	})
	return nw
}

func (nw *nodeWatch) run(ctx context.Context) error {
	nw.informer.RunWithContext(ctx)
	return nil
}

func (nw *nodeWatch) get() *v1.Node {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.node
}

// waitForIPs waits, as upstream does, up to timeout for the Node to exist with
// addresses, and carries on without them.
func (nw *nodeWatch) waitForIPs(ctx context.Context, logger klog.Logger, timeout time.Duration) *v1.Node {
	if !cache.WaitForCacheSync(ctx.Done(), nw.informer.HasSynced) {
		return nil
	}
	has := func() bool { n := nw.get(); return n != nil && len(n.Status.Addresses) > 0 }
	if !has() {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_ = wait.PollUntilContextCancel(wctx, time.Second, false, func(context.Context) (bool, error) { return has(), nil })
	}
	n := nw.get()
	nw.mu.Lock()
	if n != nil {
		nw.ips = hostIPs(n)
	}
	nw.ipsSet = true
	nw.mu.Unlock()
	switch {
	case n == nil:
		logger.Error(nil, "Timed out waiting for node to exist", "node", klog.KRef("", nw.name))
	case len(n.Status.Addresses) == 0:
		logger.Error(nil, "Timed out waiting for node to be assigned IPs", "node", klog.KRef("", nw.name))
	}
	return n
}
