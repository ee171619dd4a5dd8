package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
)

// defaultStateDir is /var/lib/nodekit/NAME for root, else $XDG_STATE_HOME/nodekit/NAME.
func defaultStateDir(name string) string {
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib/nodekit", name)
	}
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "nodekit", name)
}

// besideSelf is the path of name in the nodekit binary's own folder when it exists
// there, else "".
func besideSelf(name string) string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), name)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return p
	}
	return ""
}

func defaultStateKubeconfig() string {
	p := filepath.Join(defaultStateDir("nodekit"), "kubeconfig")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func stateDirFlag(fs *flag.FlagSet) (name, dir *string) {
	name = fs.String("name", "nodekit", "cluster name: prefixes its network namespaces (nk-NAME-...)")
	dir = fs.String("state-dir", "", "folder holding everything of the cluster (default /var/lib/nodekit/NAME as root, else $XDG_STATE_HOME/nodekit/NAME)")
	return name, dir
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

func runUp(args []string) (int, error) {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	name, dir := stateDirFlag(fs)
	var cfg cluster.Config
	fs.IntVar(&cfg.Nodes, "nodes", 1, "number of nodes")
	fs.IntVar(&cfg.APIPort, "api-port", cluster.APIServerPort, "port on 127.0.0.1 where kubectl reaches the API server")
	fs.StringVar(&cfg.PeersDir, "peers-dir", os.Getenv("NODEKIT_PEERS_DIR"), "folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler (hack/build-peers.sh)")
	fs.StringVar(&cfg.ImagesDir, "images-dir", os.Getenv("NODEKIT_IMAGES_DIR"), "folder with images.tsv and image tars (hack/setup-containerd.sh)")
	fs.StringVar(&cfg.KubeletBinary, "kubelet-binary", besideSelf("kubelet"), "nodekit's kubelet agent binary (default: kubelet beside the nodekit binary, as hack/up.sh builds it; \"none\": nodes run containerd only)")
	fs.StringVar(&cfg.KubeProxyBinary, "kube-proxy-binary", besideSelf("kube-proxy"), "nodekit's kube-proxy agent binary (default: kube-proxy beside the nodekit binary; \"none\": no Service rules)")
	fs.StringVar(&cfg.ContainerdDir, "containerd-dir", os.Getenv("NODEKIT_CONTAINERD_DIR"), "folder with containerd, containerd-shim-runc-v2 and ctr for every node (hack/build-containerd.sh builds containerd 2.x, which image volumes need); empty: the machine's containerd on $PATH")
	fs.StringVar(&cfg.CoreDNSImageTar, "coredns-image-tar", os.Getenv("NODEKIT_COREDNS_IMAGE_TAR"), "CoreDNS image tar from hack/build-coredns.sh: imported into every node and deployed as kubeadm does (kube-dns at 10.96.0.10); empty: no DNS add-on")
	fs.DurationVar(&cfg.NodeMonitorGracePeriod, "node-monitor-grace-period", 50*time.Second, "kube-controller-manager's --node-monitor-grace-period")
	fs.BoolVar(&cfg.HostNetwork, "host-network", false, "run one node, and the control plane, on the machine's own network as a kubeadm single-node cluster does (changes the machine: see docs/up.md; nodekit down undoes it)")
	fs.StringVar(&cfg.NodeIP, "node-ip", "", "with --host-network: the node's address (default: the address of the interface with the default route)")
	detach := fs.Bool("detach", false, "return once the cluster is ready, leaving a supervisor running; stop it with nodekit down")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up bringing the cluster up after this long")
	if err := parse(fs, args); err != nil {
		return exitError, err
	}
	cfg.Name, cfg.StateDir = *name, *dir
	for _, b := range []*string{&cfg.KubeletBinary, &cfg.KubeProxyBinary} {
		if *b == "none" {
			*b = ""
		}
	}
	if cfg.StateDir == "" {
		cfg.StateDir = defaultStateDir(cfg.Name)
	}
	if os.Geteuid() != 0 {
		return exitError, fmt.Errorf("%w: nodekit up makes network namespaces and runs containerd: run it as root", cluster.ErrPrerequisite)
	}
	cfg.Log = os.Stderr
	begin := time.Now()
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	upCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c, err := cluster.Up(upCtx, cfg)
	if err != nil {
		return exitError, err
	}
	kubeconfig := c.Kubeconfig()
	if *detach && c.Listener == nil {
		// --host-network: the API server listens on the machine's network itself; there
		// is no forwarder to keep running.
		printReady(c, kubeconfig, begin)
		return exitOK, nil
	}
	if *detach {
		if err := startSupervisor(c); err != nil {
			derr := cluster.Down(context.Background(), c.State().StateDir, os.Stderr)
			return exitError, errors.Join(err, derr)
		}
		c.Listener.Close()
		if c.MirrorListener != nil {
			c.MirrorListener.Close()
		}
		printReady(c, kubeconfig, begin)
		return exitOK, nil
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(ctx) }()
	printReady(c, kubeconfig, begin)
	fmt.Fprintln(os.Stderr, "nodekit up: running in the foreground; Ctrl-C stops the cluster and removes it")
	var serveErr error
	select {
	case <-ctx.Done():
		serveErr = <-served
	case serveErr = <-served:
	}
	fmt.Fprintln(os.Stderr, "nodekit up: stopping")
	if err := cluster.Down(context.Background(), c.State().StateDir, os.Stderr); err != nil {
		return exitError, errors.Join(serveErr, err)
	}
	return exitOK, serveErr
}

func printReady(c *cluster.Cluster, kubeconfig string, begin time.Time) {
	st := c.State()
	if !c.HasKubelet() {
		fmt.Fprintln(os.Stderr, "nodekit up: no kubelet binary (--kubelet-binary): the nodes run containerd only and do not register")
	}
	fmt.Printf("kubeconfig: %s\n", kubeconfig)
	where := ""
	if st.HostNetwork {
		where = " on the machine's network (" + st.ControlPlaneIP + ")"
	}
	fmt.Printf("cluster %q ready in %s: %d node(s)%s, API server https://127.0.0.1:%d; try: KUBECONFIG=%s kubectl get nodes -o wide\n",
		st.Name, time.Since(begin).Round(100*time.Millisecond), len(st.Nodes), where, st.APIPort, kubeconfig)
}

// startSupervisor hands the forwarder's listening socket (fd 3) and the registry
// mirror's (fd 4) to a detached `nodekit supervise` process, which keeps serving them
// after `up` returns.
func startSupervisor(c *cluster.Cluster) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	lf, err := c.Listener.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	defer lf.Close()
	files := []*os.File{lf}
	if c.MirrorListener != nil {
		mf, err := c.MirrorListener.(*net.TCPListener).File()
		if err != nil {
			return err
		}
		defer mf.Close()
		files = append(files, mf)
	}
	st := c.State()
	logPath := filepath.Join(st.StateDir, "logs", "supervisor.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(self, "supervise", "--state-dir", st.StateDir)
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the supervisor: %w", err)
	}
	if err := cluster.RecordSupervisor(st, cmd.Process.Pid, logPath); err != nil {
		return err
	}
	_ = cmd.Process.Release()
	// Ready once kubectl's path through it answers.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		if last = cluster.ReadyzThroughForwarder(ctx, filepath.Join(st.StateDir, "kubeconfig")); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the supervisor's forwarder does not answer: %v (see %s)", last, logPath)
}

// runSupervise is the detached process: it serves the forwarder socket it inherited
// (fd 3), and the registry mirror's (fd 4) when the state records a mirror, until
// SIGTERM.
func runSupervise(args []string) (int, error) {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	dir := fs.String("state-dir", "", "the cluster's state dir")
	if err := parse(fs, args); err != nil {
		return exitError, err
	}
	st, err := cluster.LoadState(*dir)
	if err != nil {
		return exitError, err
	}
	l, err := net.FileListener(os.NewFile(3, "forwarder"))
	if err != nil {
		return exitError, fmt.Errorf("inherited listener: %w", err)
	}
	var ml net.Listener
	if st.Mirror != "" {
		if ml, err = net.FileListener(os.NewFile(4, "mirror")); err != nil {
			return exitError, fmt.Errorf("inherited registry mirror listener: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "supervisor: forwarding 127.0.0.1:%d to %s:%d\n", st.APIPort, st.ControlPlaneIP, cluster.APIServerPort)
	if ml != nil {
		fmt.Fprintf(os.Stderr, "supervisor: registry mirror on %s (the images in %s)\n", st.Mirror, cluster.MirrorListFile(st.StateDir))
	}
	return exitOK, cluster.Supervise(ctx, st, l, ml, os.Stderr)
}

func runDown(args []string) (int, error) {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	name, dir := stateDirFlag(fs)
	if err := parse(fs, args); err != nil {
		return exitError, err
	}
	if *dir == "" {
		*dir = defaultStateDir(*name)
	}
	if err := cluster.Down(context.Background(), *dir, os.Stderr); err != nil {
		return exitError, err
	}
	fmt.Fprintf(os.Stderr, "nodekit down: cluster in %s removed\n", *dir)
	return exitOK, nil
}

func runStatus(args []string) (int, error) {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	name, dir := stateDirFlag(fs)
	if err := parse(fs, args); err != nil {
		return exitError, err
	}
	if *dir == "" {
		*dir = defaultStateDir(*name)
	}
	st, err := cluster.LoadState(*dir)
	if err != nil {
		return exitError, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep := cluster.Status(ctx, st)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PART\tNODE\tPID\tSTATE\tDETAIL")
	for _, p := range rep.Parts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, orDash(p.Node), orDash(p.PID), p.State, p.Detail)
	}
	if err := tw.Flush(); err != nil {
		return exitError, err
	}
	if !rep.Healthy {
		return exitUnhealthy, nil
	}
	return exitOK, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runLoad(args []string) (int, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	name, dir := stateDirFlag(fs)
	var tars []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return exitError, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest = fs.Args()
		if len(rest) > 0 {
			tars = append(tars, rest[0])
			rest = rest[1:]
		}
	}
	if len(tars) == 0 {
		return exitError, fmt.Errorf("%w: nodekit load IMAGE.tar [IMAGE.tar...]", errUsage)
	}
	if *dir == "" {
		*dir = defaultStateDir(*name)
	}
	st, err := cluster.LoadState(*dir)
	if err != nil {
		return exitError, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, tar := range tars {
		if err := cluster.Load(ctx, st, tar); err != nil {
			return exitError, err
		}
		fmt.Fprintf(os.Stderr, "nodekit load: %s imported into %d node(s)\n", tar, len(st.Nodes))
	}
	return exitOK, nil
}

func runRestart(args []string) (int, error) {
	fs := flag.NewFlagSet("restart", flag.ContinueOnError)
	name, dir := stateDirFlag(fs)
	node := fs.String("node", "", "the node whose part to restart (empty: a control-plane part)")
	var parts []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return exitError, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest = fs.Args()
		if len(rest) > 0 {
			parts = append(parts, rest[0])
			rest = rest[1:]
		}
	}
	if len(parts) != 1 {
		return exitError, fmt.Errorf("%w: nodekit restart PART [--node NODE], PART one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy", errUsage)
	}
	if *dir == "" {
		*dir = defaultStateDir(*name)
	}
	st, err := cluster.LoadState(*dir)
	if err != nil {
		return exitError, err
	}
	p, err := cluster.Restart(st, parts[0], *node)
	if err != nil {
		return exitError, err
	}
	fmt.Fprintf(os.Stderr, "nodekit restart: %s %s running again as pid %d (log %s)\n", p.Name, p.Node, p.PID, p.Log)
	return exitOK, nil
}
