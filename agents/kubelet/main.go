// Command kubelet is nodekit's reference kubelet: it registers the node, heartbeats
// its Lease, runs the pods bound to it (and static pods from a folder) through a CRI
// runtime, probes them and reports node and pod status, with the upstream kubelet's
// flags, config file, names, reasons and messages. docs/kubelet.md says what it does
// and does not do against the upstream kubelet.
package main

import (
	"context"
	"errors"
	goflag "flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/certs"
	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/stats"
	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/lease"
)

// options are the command-line flags, named as the upstream kubelet's.
type options struct {
	config            string
	kubeconfig        string
	hostnameOverride  string
	nodeIP            string
	nodeLabels        string
	registerTaints    string
	rootDir           string
	runtimeEndpoint   string
	registerTaintsSet bool
	runtimeSet        bool

	// Joining a cluster (join.go).
	bootstrapKubeconfig string
	certDir             string

	// Container garbage collection (gc.go): the kubelet's deprecated GC flags.
	minimumContainerTTL time.Duration
	maxDeadPerContainer int32
	maxDeadContainers   int32
}

func newFlagSet(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.StringVar(&o.config, "config", "", "The Kubelet will load its initial configuration from this file (a KubeletConfiguration, kubelet.config.k8s.io/v1beta1). Omit this flag to use the built-in default configuration values. Command-line flags override configuration from this file.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file, specifying how to connect to the API server. Providing --kubeconfig enables API server mode, omitting --kubeconfig enables standalone mode.")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "If non-empty, will use this string as identification instead of the actual hostname.")
	fs.StringVar(&o.nodeIP, "node-ip", "", "IP address of the node. If set, kubelet will use this IP address for the node.")
	fs.StringVar(&o.nodeLabels, "node-labels", "", "Labels to add when registering the node in the cluster. Labels must be key=value pairs separated by ','. Labels in the 'kubernetes.io' namespace must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) or be in the specifically allowed set.")
	fs.StringVar(&o.registerTaints, "register-with-taints", "", "Register the node with the given list of taints (comma separated \"<key>=<value>:<effect>\"). No-op if register-node is false.")
	fs.StringVar(&o.rootDir, "root-dir", defaultRootDir, "Directory path for managing kubelet files (volume mounts, etc).")
	fs.StringVar(&o.runtimeEndpoint, "container-runtime-endpoint", "", "The endpoint of the container runtime. unix domain sockets are supported on Linux (default \"unix:///run/containerd/containerd.sock\").")
	fs.StringVar(&o.bootstrapKubeconfig, "bootstrap-kubeconfig", "", "Path to a kubeconfig file that will be used to get client certificate for kubelet. If the file specified by --kubeconfig does not exist, the bootstrap kubeconfig is used to request a client certificate from the API server. On success, a kubeconfig file referencing the generated client certificate and key is written to the path specified by --kubeconfig. The client certificate and key file will be stored in the directory pointed by --cert-dir.")
	fs.StringVar(&o.certDir, "cert-dir", defaultCertDir, "The directory where the TLS certs are located. If --tls-cert-file and --tls-private-key-file are provided, this flag will be ignored.")
	fs.DurationVar(&o.minimumContainerTTL, "minimum-container-ttl-duration", 0, "Minimum age for a finished container before it is garbage collected.  Examples: '300ms', '10s' or '2h45m'")
	fs.Int32Var(&o.maxDeadPerContainer, "maximum-dead-containers-per-container", 1, "Maximum number of old instances to retain per container.  Each container takes up some disk space.")
	fs.Int32Var(&o.maxDeadContainers, "maximum-dead-containers", -1, "Maximum number of old instances of containers to retain globally.  Each container takes up some disk space. To disable, set to a negative number.")
	for _, name := range []string{"minimum-container-ttl-duration", "maximum-dead-containers-per-container", "maximum-dead-containers"} {
		_ = fs.MarkDeprecated(name, "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.")
	}
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	// Only -v (and --vmodule) of klog's flags, as the kubelet's logging options expose.
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(gfs.Lookup(name))
	}
	return fs
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		klog.ErrorS(err, "command failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(args []string) error {
	var o options
	fs := newFlagSet(&o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	o.registerTaintsSet = fs.Changed("register-with-taints")
	o.runtimeSet = fs.Changed("container-runtime-endpoint")
	cfg, err := buildConfig(&o)
	if err != nil {
		return err
	}
	applyGCPercent()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	return runKubelet(ctx, &o, cfg)
}

// defaultGCPercent is the garbage collector's target unless GOGC is set. Nearly all
// of an idle kubelet's heap is long-lived (the pod and node caches, the scheme, the
// metrics registry), and what it allocates between collections is garbage from its
// periodic work (the runtime relist every second, pod resyncs, node status), so
// Go's default of the whole live heap again mostly holds garbage: with 110 pods a
// 10 MB live heap had a 21 MB goal. Half keeps the heap nearer its live size for a
// few more short collections. A quarter (kube-proxy's) saved another 2 to 4 MiB
// but cost twice that CPU again, taking the idle kubelet to half the upstream one's
// CPU; docs/benchmarks.md (run I) has the three measured side by side.
const defaultGCPercent = 50

// applyGCPercent sets defaultGCPercent unless GOGC is set, which wins as it does for
// any Go program.
func applyGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// buildConfig loads --config, lets the flags override it as the kubelet does, logs
// every field it will not honour, and validates the result.
func buildConfig(o *options) (*kubeletv1beta1.KubeletConfiguration, error) {
	cfg, ignored, err := loadConfig(o.config)
	if err != nil {
		return nil, err
	}
	for _, f := range ignored {
		klog.InfoS("KubeletConfiguration field is not honoured by nodekit's kubelet; ignoring it", "field", f)
	}
	if o.runtimeSet {
		cfg.ContainerRuntimeEndpoint = o.runtimeEndpoint
	}
	if o.registerTaintsSet {
		taints, err := parseTaints(o.registerTaints)
		if err != nil {
			return nil, fmt.Errorf("%w: --register-with-taints: %w", ErrInvalidConfig, err)
		}
		cfg.RegisterWithTaints = taints
	}
	if err := validateConfig(cfg); err != nil {
		return nil, err
	}
	if _, err := parseNodeLabels(o.nodeLabels); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if o.bootstrapKubeconfig != "" && o.kubeconfig == "" {
		return nil, fmt.Errorf("%w: --bootstrap-kubeconfig %s needs --kubeconfig, the file the bootstrap writes", ErrInvalidConfig, o.bootstrapKubeconfig)
	}
	if o.nodeIP != "" && net.ParseIP(o.nodeIP) == nil {
		return nil, fmt.Errorf("%w: --node-ip %q is not a valid IP address", ErrInvalidConfig, o.nodeIP)
	}
	return cfg, nil
}

// hostnameFor returns the node's name as the kubelet computes it: the override or the
// machine's hostname, trimmed and lowercased.
func hostnameFor(override string) (string, error) {
	h := override
	if h == "" {
		var err error
		if h, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("couldn't determine hostname: %w", err)
		}
	}
	h = strings.ToLower(strings.TrimSpace(h))
	if h == "" {
		return "", fmt.Errorf("empty hostname is invalid")
	}
	return h, nil
}

func runKubelet(ctx context.Context, o *options, cfg *kubeletv1beta1.KubeletConfiguration) error {
	klog.InfoS("Kubelet version", "kubeletVersion", KubeletVersion)
	hostname, err := hostnameFor(o.hostnameOverride)
	if err != nil {
		return err
	}
	nodeName := hostname
	var nodeIP net.IP
	if o.nodeIP != "" {
		nodeIP = net.ParseIP(o.nodeIP)
	} else if nodeIP, err = utilnet.ChooseHostInterface(); err != nil {
		return fmt.Errorf("can't get ip address of node %s: %w", nodeName, err)
	}
	labels, _ := parseNodeLabels(o.nodeLabels)
	registerMetrics()
	nodeName2 := nodeName
	nodeNameGauge(nodeName2)

	if err := os.MkdirAll(o.rootDir, 0o750); err != nil {
		return fmt.Errorf("create root dir %s: %w", o.rootDir, err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	logCtx := klog.NewContext(ctx, klog.Background())

	runtime, err := connectRuntime(logCtx, cfg)
	if err != nil {
		return err
	}
	defer runtime.Close()

	var client kubernetes.Interface
	var serving *certs.Serving
	if o.kubeconfig != "" {
		creds, err := joinCluster(logCtx, o, cfg, nodeName, hostname, nodeIP)
		if err != nil {
			return err
		}
		defer creds.stop()
		serving = creds.serving
		rc := creds.rest
		rc.QPS = float32(*cfg.KubeAPIQPS)
		rc.Burst = int(cfg.KubeAPIBurst)
		rc.ContentType = cfg.ContentType
		rc.UserAgent = "kubelet/" + KubeletVersion + " (linux) nodekit"
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	} else {
		klog.InfoS("No API server defined - no node status update will be sent")
	}
	// The kubelet API's authentication and authorization are built before anything
	// runs, so a webhook without a client (standalone mode) stops the kubelet at
	// start, as upstream's BuildAuth does.
	auth, err := buildAuth(client, cfg)
	if err != nil {
		return err
	}
	// Container log rotation (nil when containerLogMaxSize is negative).
	logManager, err := newContainerLogManager(criLogRuntime{Client: runtime, timeout: cfg.RuntimeRequestTimeout.Duration}, cfg, clock.RealClock{})
	if err != nil {
		return fmt.Errorf("failed to initialize container log manager: %w", err)
	}

	var recorder record.EventRecorder
	if client != nil {
		b := record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{
			QPS: float32(*cfg.EventRecordQPS), BurstSize: int(cfg.EventBurst),
		})
		b.StartStructuredLogging(3)
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
		defer b.Shutdown()
		recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: nodeName})
	}

	ns := &nodeStatus{
		client: client, name: nodeName, hostname: hostname, nodeIP: nodeIP, labels: labels, cfg: cfg,
		rootDir: o.rootDir, runtime: runtime, machine: newMachine(), clock: clock.RealClock{}, recorder: recorder,
	}
	evictionCfg, err := newEvictionConfig(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	evictions := newEvictionManager(evictionCfg, clock.RealClock{}, recorder, ns.nodeRef())
	ns.eviction = evictions
	evictionStats, err := stats.New(stats.Config{Runtime: stats.CRIRuntime(runtime), NodeName: nodeName, RootDir: o.rootDir, PodLogsDir: cfg.PodLogsDir})
	if err != nil {
		return fmt.Errorf("eviction manager stats: %w", err)
	}
	health := newHealth(clock.RealClock{})
	srv, err := serveHealthz(cfg, health)
	if err != nil {
		return err
	}
	defer srv.Close()

	if recorder != nil {
		recorder.Eventf(ns.nodeRef(), corev1.EventTypeNormal, "Starting", "Starting kubelet.")
	}
	done := make(chan struct{})
	var workers int
	start := func(fn func()) {
		workers++
		go func() { defer func() { done <- struct{}{} }(); fn() }()
	}
	if client != nil {
		ns.watchNode(logCtx)
		start(func() {
			if *cfg.RegisterNode {
				if err := ns.register(logCtx); err != nil {
					return
				}
			}
			ns.run(logCtx)
		})
		lc := lease.NodeConfig(client, nodeName)
		lc.Duration = time.Duration(cfg.NodeLeaseDurationSeconds) * time.Second
		lctl, err := lease.New(lc)
		if err != nil {
			return fmt.Errorf("node lease: %w", err)
		}
		start(func() { _ = lctl.Run(logCtx) })
	} else {
		// Standalone: the runtime check still runs, for /healthz and the logs.
		start(func() {
			t := time.NewTicker(cfg.NodeStatusUpdateFrequency.Duration)
			defer t.Stop()
			for {
				ns.checkRuntime(logCtx)
				select {
				case <-logCtx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	pods, err := newPodManager(podManagerConfig{
		client: client, nodeName: nodeName, cfg: cfg, rootDir: o.rootDir, runtime: runtime,
		recorder: recorder, health: health, node: ns, nodeIP: nodeIP, logs: logManager,
	})
	if err != nil {
		return err
	}
	evictions.stats = &nodeEvictionStats{provider: evictionStats, imageFs: stats.CRIRuntime(runtime).ImageFsInfo, rootDir: o.rootDir, cgroups: pods.cgroups}
	evictions.pods = pods
	pods.eviction = evictions
	start(func() { evictions.run(logCtx) })
	start(func() {
		if err := pods.run(logCtx); err != nil && logCtx.Err() == nil {
			klog.ErrorS(err, "Pod manager stopped")
		}
	})
	if logManager != nil {
		start(func() { logManager.run(logCtx) })
	}
	nodeEvent := nodeWarning(recorder, ns.nodeRef())
	cgc, igc, err := newGarbageCollectors(logCtx, o, cfg, runtime, logManager, pods, nodeName, o.rootDir, nodeEvent)
	if err != nil {
		stop()
		for range workers {
			<-done
		}
		return err
	}
	start(func() {
		runGarbageCollection(logCtx, clock.RealClock{}, gcPeriods(), cgc, igc, nodeEvent)
	})
	if *cfg.EnableServer {
		sc := ServerConfig{
			NodeName: nodeName, Hostname: hostname, CertDir: o.certDir, Config: cfg, Client: client,
			Pods: pods, Runtime: runtime, Health: http.HandlerFunc(health.serve), auth: auth,
		}
		if serving != nil {
			// serverTLSBootstrap: the certificate the CSR brought, rotated by its manager.
			sc.GetCertificate = serving.GetCertificate
		}
		if sc.Stats, sc.ResourceMetrics, err = statsHandlers(runtime, nodeName, o.rootDir, cfg.PodLogsDir); err != nil {
			stop()
			for range workers {
				<-done
			}
			return err
		}
		api, err := newKubeletServer(sc)
		if err == nil {
			_, err = api.Start(logCtx)
		}
		if err != nil {
			// As the kubelet, which exits when its server cannot listen.
			stop()
			for range workers {
				<-done
			}
			return err
		}
		defer api.Close()
	}
	<-ctx.Done()
	klog.InfoS("Shutting down kubelet; pods keep running")
	for range workers {
		<-done
	}
	return nil
}

// statsHandlers builds /stats/ (only /stats/summary is served, as the 1.37 kubelet)
// and /metrics/resource from the runtime's CRI stats, /proc and the root cgroup.
func statsHandlers(runtime *cri.Client, nodeName, rootDir, podLogsDir string) (statsH, resourceMetrics http.Handler, err error) {
	p, err := stats.New(stats.Config{Runtime: stats.CRIRuntime(runtime), NodeName: nodeName, RootDir: rootDir, PodLogsDir: podLogsDir})
	if err != nil {
		return nil, nil, fmt.Errorf("stats provider: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/stats/summary", p.SummaryHandler())
	return mux, p.ResourceMetricsHandler(), nil
}

func nodeNameGauge(name string) { nodeName.WithLabelValues(name).Set(1) }

// connectRuntime dials the CRI runtime, waiting for it as the kubelet does at start.
func connectRuntime(ctx context.Context, cfg *kubeletv1beta1.KubeletConfiguration) (*cri.Client, error) {
	for {
		c, err := cri.New(ctx, cri.Config{
			Endpoint:    cfg.ContainerRuntimeEndpoint,
			CallTimeout: cfg.RuntimeRequestTimeout.Duration,
			Metrics:     criMetrics{},
		})
		if err == nil {
			v := c.RuntimeVersion()
			klog.InfoS("Container runtime initialized", "containerRuntime", v.GetRuntimeName(), "version", v.GetRuntimeVersion(), "apiVersion", v.GetRuntimeApiVersion())
			return c, nil
		}
		klog.ErrorS(err, "Container runtime not reachable yet, retrying", "endpoint", cfg.ContainerRuntimeEndpoint)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to the container runtime at %s: %w", cfg.ContainerRuntimeEndpoint, err)
		case <-time.After(2 * time.Second):
		}
	}
}

// serveHealthz serves /healthz and /metrics on healthzBindAddress:healthzPort
// (healthzPort 0 disables it, as upstream).
func serveHealthz(cfg *kubeletv1beta1.KubeletConfiguration, h *health) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", h.serve)
	mux.Handle("/metrics", legacyregistry.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if *cfg.HealthzPort == 0 {
		return srv, nil
	}
	addr := net.JoinHostPort(cfg.HealthzBindAddress, strconv.Itoa(int(*cfg.HealthzPort)))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("healthz server: %w", err)
	}
	klog.InfoS("Starting healthz server", "address", addr)
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}
