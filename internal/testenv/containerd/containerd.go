// Package containerd starts a private containerd (with runc, and optionally CNI and a
// loopback image registry) for one test, so CRI code is exercised against the real
// runtime rather than a mock.
//
// # Prerequisites
//
// Root, and what hack/setup-containerd.sh installs and builds: containerd, runc,
// containernetworking-plugins (/usr/lib/cni), docker-registry and skopeo from apt, and the
// pause and busybox OCI image tars in the folder the script prints, which the test
// command exports as NODEKIT_IMAGES_DIR. A missing prerequisite ends the test through
// testenv.Unavailable: a skip on a casual run, a failure under CI=true.
//
// # What each run gets
//
// A temporary folder under /tmp holding containerd's root, state, sockets, runc root, CNI
// configuration and IPAM data, and its log. The CRI plugin is configured the way
// RECIPES.md measured to work on these machines (restrict_oom_score_adj is required
// without CAP_SYS_RESOURCE). With Options.CNI a bridge + host-local conflist is written
// before containerd starts; its /24 and bridge name are unique on the machine for the
// run's lifetime (an flock per subnet), so parallel test binaries do not clash. The
// bridge and the pods' veths live in the network namespace containerd runs in: the
// root one by default (what containerd's CNI does on a real node), or, with
// Options.NetNS, a namespace the test created, which is how the node agents' tests
// keep node networking out of the machine's own namespace. Without Options.CNI the runtime reports NetworkReady=false,
// as on a node whose network plugin never started. Options.Registry adds Debian's
// docker-registry on 127.0.0.1 holding the busybox image (Options.RegistryAuth puts it
// behind basic auth), so image pulls are real.
//
// # Cleanup
//
// On test cleanup every pod sandbox is stopped and removed through CRI (so CNI releases
// veths and addresses), containerd is stopped, shims it started are killed by PID, mounts
// under the run's folder are detached, the bridge the run named is deleted and the folder
// is removed.
package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/containerdconf"
	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// Options selects the optional parts of a run.
type Options struct {
	// CNI writes a bridge + host-local network config so pod sandboxes get an IP.
	// Without it the runtime reports NetworkReady=false and RunPodSandbox fails unless
	// the pod uses the host network.
	CNI bool
	// Registry starts Debian's docker-registry on a random 127.0.0.1 port and pushes the
	// busybox image to it, so pulls (RegistryImage) go over the wire for real.
	Registry bool
	// RegistryAuth makes the registry (implied) require basic auth with
	// RegistryCredentials, so pulls without credentials fail with 401.
	RegistryAuth bool
	// NetNS, when set, is a path naming a network namespace the test created (for
	// example netns.Namespace.Path()); containerd runs inside it (through nsenter
	// --net=NetNS), so the CNI bridge, the pods' veths and their routes live there
	// and never in the machine's own namespace. The namespace must outlive the run
	// (create it before calling Start, so its cleanup runs after this one).
	NetNS string
	// BinDir, when set, holds the containerd, containerd-shim-runc-v2 and ctr to run
	// instead of the machine's on $PATH (Debian's 1.6): hack/build-containerd.sh
	// builds containerd 2.x into one, which features such as image volumes (CRI
	// image mounts, containerd 2.1 and later) need. V2Dir finds it.
	BinDir string

	// pickPorts chooses the registry's port. Nil means testenv.FreePorts; tests of the
	// retry hand out a taken port.
	pickPorts func(n int) ([]int, error)
}

// V2Dir returns the folder of containerd 2.x binaries hack/build-containerd.sh
// built, from NODEKIT_TEST_CONTAINERD2_DIR (the README's test command exports it) or
// NODEKIT_CONTAINERD_DIR (what nodekit up reads), for
// Options.BinDir. Unset ends the test through testenv.Unavailable.
func V2Dir(tb testing.TB) string {
	tb.Helper()
	for _, env := range []string{"NODEKIT_TEST_CONTAINERD2_DIR", "NODEKIT_CONTAINERD_DIR"} {
		if dir := os.Getenv(env); dir != "" {
			return dir
		}
	}
	testenv.Unavailable(tb, "NODEKIT_TEST_CONTAINERD2_DIR is unset: export NODEKIT_TEST_CONTAINERD2_DIR=$(hack/build-containerd.sh)")
	return ""
}

// The registry's fixed test credentials. The htpasswd line is a bcrypt hash (cost 4)
// of the password, made once for this fixture.
const (
	registryUser     = "nodekit"
	registryPassword = "nodekit-test-password"
	registryHtpasswd = "nodekit:$2b$04$9Qyu5udccVzrodpqeCB2T.AFHA3gCsM6lpTZXZH1d4WP3/RPggcTq\n"
)

// Containerd is one running containerd. Its methods are safe to call from the test's
// goroutine; Kill and Restart are for crash-recovery tests.
type Containerd struct {
	opts Options
	dir  string
	bin  string
	ctr  string
	// shim is the runc shim's path when it is not the one on $PATH.
	shim    string
	nsenter string
	config  string
	address string
	proc    *testenv.Process
	images  images
	// version is bin's (`containerd --version`): it picks the configuration layout.
	version containerdconf.Version

	bridge string
	subnet *net.IPNet
	lock   *os.File

	registryHost string
	registry     *testenv.Process
}

type images struct {
	pause, busybox       string
	pauseTar, busyboxTar string
}

// readyTimeout bounds containerd's start-up (measured 0.3 to 0.6 s here).
const readyTimeout = 30 * time.Second

// Start starts a containerd for tb and registers its cleanup.
func Start(tb testing.TB, opts Options) *Containerd {
	tb.Helper()
	testenv.RequireRoot(tb)
	if opts.RegistryAuth {
		opts.Registry = true
	}
	c := &Containerd{opts: opts}
	testenv.LookPath(tb, "runc")
	if opts.BinDir == "" {
		c.bin = testenv.LookPath(tb, "containerd")
		c.ctr = testenv.LookPath(tb, "ctr")
		testenv.LookPath(tb, "containerd-shim-runc-v2")
	} else {
		for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
			if st, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil || st.Mode()&0o111 == 0 {
				testenv.Unavailable(tb, "%s not found in %s (hack/build-containerd.sh builds it)", b, opts.BinDir)
			}
		}
		c.bin, c.ctr = filepath.Join(opts.BinDir, "containerd"), filepath.Join(opts.BinDir, "ctr")
		c.shim = filepath.Join(opts.BinDir, "containerd-shim-runc-v2")
	}
	if opts.CNI {
		for _, p := range []string{"bridge", "host-local", "loopback"} {
			if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
				testenv.Unavailable(tb, "CNI plugin %s missing in %s (apt-get install containernetworking-plugins)", p, cniBinDir)
			}
		}
	}
	if opts.NetNS != "" {
		c.nsenter = testenv.LookPath(tb, "nsenter")
		if _, err := os.Stat(opts.NetNS); err != nil {
			tb.Fatalf("containerd: network namespace %s: %v", opts.NetNS, err)
		}
	}
	if opts.Registry {
		testenv.LookPath(tb, "docker-registry")
		testenv.LookPath(tb, "skopeo")
	}
	c.images = loadImages(tb)
	version, err := containerdconf.BinaryVersion(context.Background(), c.bin)
	if err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	c.version = version

	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "nkctd-")
	if err != nil {
		tb.Fatalf("containerd: temp dir: %v", err)
	}
	c.dir = dir
	tb.Cleanup(c.cleanup(tb))
	c.address = filepath.Join(dir, "containerd.sock")

	if opts.CNI {
		if err := c.pickNetwork(); err != nil {
			tb.Fatalf("containerd: %v", err)
		}
		if err := c.writeCNIConfig(); err != nil {
			tb.Fatalf("containerd: %v", err)
		}
	}
	if opts.Registry {
		if err := c.startRegistry(tb); err != nil {
			tb.Fatalf("containerd: %v", err)
		}
	}
	if err := c.writeConfig(); err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	start := time.Now()
	if err := c.start(tb); err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	tb.Logf("containerd ready in %s (%s)", time.Since(start).Round(time.Millisecond), c.Endpoint())
	if err := c.importImages(tb); err != nil {
		tb.Fatalf("containerd: %v", err)
	}
	return c
}

const cniBinDir = "/usr/lib/cni"

// Endpoint is the CRI endpoint, unix:///path/containerd.sock.
func (c *Containerd) Endpoint() string { return "unix://" + c.address }

// Address is the path of containerd's gRPC socket.
func (c *Containerd) Address() string { return c.address }

// Dir is the run's folder (root, state, log, CNI config).
func (c *Containerd) Dir() string { return c.dir }

// LogPath is containerd's log file.
func (c *Containerd) LogPath() string { return filepath.Join(c.dir, "containerd.log") }

// PauseImage is the sandbox image containerd is configured with, already imported.
func (c *Containerd) PauseImage() string { return c.images.pause }

// BusyboxImage is a busybox image already present in containerd (imported, not pulled).
func (c *Containerd) BusyboxImage() string { return c.images.busybox }

// NetNS is the network namespace containerd runs in (Options.NetNS), "" for the
// machine's own.
func (c *Containerd) NetNS() string { return c.opts.NetNS }

// WriteCNIConfig writes the bridge conflist into containerd's CNI folder after start:
// the recovery step of a node whose network plugin was missing. Without Options.CNI
// the run had no subnet yet; one is picked now.
func (c *Containerd) WriteCNIConfig() error {
	if c.subnet == nil {
		if err := c.pickNetwork(); err != nil {
			return err
		}
	}
	return c.writeCNIConfig()
}

// Subnet is the pods' /24 with Options.CNI, nil otherwise.
func (c *Containerd) Subnet() *net.IPNet { return c.subnet }

// Bridge is the name of the CNI bridge with Options.CNI, "" otherwise.
func (c *Containerd) Bridge() string { return c.bridge }

// RegistryHost is host:port of the loopback registry with Options.Registry, "" otherwise.
func (c *Containerd) RegistryHost() string { return c.registryHost }

// RegistryCredentials are the user and password the registry requires with
// Options.RegistryAuth; both are "" otherwise.
func (c *Containerd) RegistryCredentials() (user, password string) {
	if !c.opts.RegistryAuth {
		return "", ""
	}
	return registryUser, registryPassword
}

// RegistryImage is the busybox image's name in the loopback registry; pulling it is a
// real pull over HTTP. It is "" without Options.Registry.
func (c *Containerd) RegistryImage() string {
	if c.registryHost == "" {
		return ""
	}
	return c.registryHost + "/nodekit/busybox:1.35.0"
}

// Conn dials the CRI socket; the connection closes on test cleanup.
func (c *Containerd) Conn(tb testing.TB) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient("unix://"+c.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("containerd: dial %s: %v", c.address, err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// Kill ends containerd with SIGKILL, as a crash would. Shims and containers live on.
func (c *Containerd) Kill() {
	if c.proc != nil {
		c.proc.Kill()
	}
}

// Restart starts containerd again with the same configuration after Kill (or stops it
// first if it still runs) and waits until CRI answers.
func (c *Containerd) Restart(tb testing.TB) {
	tb.Helper()
	if c.proc != nil {
		c.proc.Stop(10 * time.Second)
	}
	start := time.Now()
	if err := c.start(tb); err != nil {
		tb.Fatalf("containerd: restart: %v", err)
	}
	tb.Logf("containerd restarted, ready in %s", time.Since(start).Round(time.Millisecond))
}

func (c *Containerd) start(tb testing.TB) error {
	// A socket left by a killed containerd makes the readiness check race the new one.
	_ = os.Remove(c.address)
	bin, args := c.bin, []string{"--config", c.config}
	if c.opts.NetNS != "" {
		// nsenter execs containerd in place, so the process (and its group) is containerd.
		bin, args = c.nsenter, append([]string{"--net=" + c.opts.NetNS, c.bin}, args...)
	}
	p, err := testenv.StartProcess("containerd", c.LogPath(), nil, bin, args...)
	if err != nil {
		return err
	}
	c.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	return p.WaitFor(ctx, 50*time.Millisecond, c.criReady)
}

// criReady succeeds once the CRI plugin answers Status with RuntimeReady=true.
func (c *Containerd) criReady(ctx context.Context) error {
	if _, err := os.Stat(c.address); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+c.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range resp.GetStatus().GetConditions() {
		if cond.GetType() == runtimeapi.RuntimeReady && cond.GetStatus() {
			return nil
		}
	}
	return fmt.Errorf("RuntimeReady is not true: %v", resp.GetStatus())
}

func loadImages(tb testing.TB) images {
	tb.Helper()
	dir := os.Getenv("NODEKIT_IMAGES_DIR")
	if dir == "" {
		testenv.Unavailable(tb, "NODEKIT_IMAGES_DIR is unset: export NODEKIT_IMAGES_DIR=$(hack/setup-containerd.sh)")
	}
	b, err := os.ReadFile(filepath.Join(dir, "images.tsv"))
	if err != nil {
		testenv.Unavailable(tb, "NODEKIT_IMAGES_DIR=%s has no images.tsv (run hack/setup-containerd.sh): %v", dir, err)
	}
	var im images
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		if len(f) != 3 {
			continue
		}
		tar := filepath.Join(dir, f[2])
		if _, err := os.Stat(tar); err != nil {
			testenv.Unavailable(tb, "image tar %s missing (run hack/setup-containerd.sh)", tar)
		}
		switch f[0] {
		case "pause":
			im.pause, im.pauseTar = f[1], tar
		case "busybox":
			im.busybox, im.busyboxTar = f[1], tar
		}
	}
	if im.pause == "" || im.busybox == "" {
		testenv.Unavailable(tb, "%s/images.tsv lacks the pause or busybox image (run hack/setup-containerd.sh)", dir)
	}
	return im
}

func (c *Containerd) writeConfig() error {
	// containerd 2.x serves NRI on one machine-wide socket by default; tests run
	// several containerds at once, and none uses NRI: the file turns it off.
	conf := containerdconf.Config{
		Root:          filepath.Join(c.dir, "root"),
		State:         filepath.Join(c.dir, "state"),
		Socket:        c.address,
		Opt:           filepath.Join(c.dir, "opt"),
		SandboxImage:  c.images.pause,
		StreamAddress: "127.0.0.1",
		// containerd looks on $PATH first, where Debian's 1.6 shim is.
		Shim:       c.shim,
		RuncRoot:   filepath.Join(c.dir, "runc"),
		CNIBinDir:  cniBinDir,
		CNIConfDir: filepath.Join(c.dir, "cni"),
		CertsDir:   filepath.Join(c.dir, "certs.d"),
	}.Render(c.version)
	for _, d := range []string{"cni", "certs.d", "runc", "opt"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			return err
		}
	}
	crictl := fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\n", c.Endpoint(), c.Endpoint())
	if err := os.WriteFile(filepath.Join(c.dir, "crictl.yaml"), []byte(crictl), 0o644); err != nil {
		return err
	}
	c.config = filepath.Join(c.dir, "config.toml")
	return os.WriteFile(c.config, []byte(conf), 0o644)
}

// Subnets come from 10.222.0.0/16, one /24 per run. An flock on a file per /24 keeps
// parallel test binaries apart; a /24 that overlaps a route already in the root
// namespace is skipped.
const (
	subnetLockDir = "/run/lock"
	bridgePrefix  = "nkctd"
)

func (c *Containerd) pickNetwork() error {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	seed := os.Getpid() + int(time.Now().UnixNano()%251)
	for i := range 254 {
		n := 1 + (seed+i)%254
		_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.222.%d.0/24", n))
		if overlaps(subnet, routes) {
			continue
		}
		bridge := fmt.Sprintf("%s%d", bridgePrefix, n)
		f, err := os.OpenFile(filepath.Join(subnetLockDir, fmt.Sprintf("nodekit-containerd-cni-%d.lock", n)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return fmt.Errorf("subnet lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		if _, err := netlink.LinkByName(bridge); err == nil {
			// Left behind by a run that crashed: not ours to remove.
			f.Close()
			continue
		}
		c.lock, c.subnet, c.bridge = f, subnet, bridge
		return nil
	}
	return errors.New("no free /24 in 10.222.0.0/16 for the CNI bridge")
}

func overlaps(subnet *net.IPNet, routes []netlink.Route) bool {
	for _, r := range routes {
		if r.Dst == nil {
			continue // the default route
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			continue // the default route, as newer netlink reports it
		}
		if r.Dst.Contains(subnet.IP) || subnet.Contains(r.Dst.IP) {
			return true
		}
	}
	return false
}

func (c *Containerd) writeCNIConfig() error {
	// cniVersion 0.4.0: what the bridge plugin of containernetworking-plugins 1.1.1 and
	// containerd 1.6's go-cni handle best. No ipMasq and no portmap: they would add
	// iptables rules to the root namespace.
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "nodekit-%[1]s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[1]q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[2]q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %[3]q
      }
    }
  ]
}
`, c.bridge, c.subnet.String(), filepath.Join(c.dir, "cni-ipam"))
	if err := os.MkdirAll(filepath.Join(c.dir, "cni"), 0o755); err != nil {
		return err
	}
	// Written before containerd starts: a file moved in later was not noticed (RECIPES.md).
	return os.WriteFile(filepath.Join(c.dir, "cni", "10-nodekit.conflist"), []byte(conf), 0o644)
}

func (c *Containerd) importImages(tb testing.TB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	for _, tar := range []string{c.images.pauseTar, c.images.busyboxTar} {
		out, err := exec.CommandContext(ctx, c.ctr, "--address", c.address, "--namespace", "k8s.io", "images", "import", tar).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v\n%s", tar, err, out)
		}
	}
	tb.Logf("containerd: imported %s and %s in %s", c.images.pause, c.images.busybox, time.Since(start).Round(time.Millisecond))
	return nil
}

// registryAttempts bounds how often the registry starts again after losing its port.
const registryAttempts = 3

func (c *Containerd) startRegistry(tb testing.TB) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := c.startRegistryOnce()
		if err == nil {
			break
		}
		if !errors.Is(err, testenv.ErrPortTaken) || attempt == registryAttempts {
			return fmt.Errorf("registry (attempt %d of %d): %w", attempt, registryAttempts, err)
		}
		c.registry.Stop(5 * time.Second)
		c.registry = nil
		if err := os.RemoveAll(filepath.Join(c.dir, "registry")); err != nil {
			return err
		}
		tb.Logf("registry: attempt %d of %d lost its port; stopped it, starting again on a fresh port: %v", attempt, registryAttempts, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	// containerd treats 127.0.0.1 as plain HTTP already; the hosts.toml says so explicitly.
	hostDir := filepath.Join(c.dir, "certs.d", c.registryHost)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+c.registryHost, "http://"+c.registryHost)
	if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return err
	}
	args := []string{"--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"}
	if c.opts.RegistryAuth {
		args = append(args, "--dest-creds", registryUser+":"+registryPassword)
	}
	args = append(args, "oci-archive:"+c.images.busyboxTar, "docker://"+c.RegistryImage())
	out, err := exec.CommandContext(ctx, "skopeo", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("skopeo copy to %s: %v\n%s", c.RegistryImage(), err, out)
	}
	tb.Logf("registry ready with %s in %s", c.RegistryImage(), time.Since(start).Round(time.Millisecond))
	return nil
}

// startRegistryOnce starts docker-registry on a port from testenv.FreePorts and waits
// until /v2/ answers from it; an error wrapping testenv.ErrPortTaken means another
// process has the port (the registry could not bind, or what answers is not it).
func (c *Containerd) startRegistryOnce() error {
	pick := c.opts.pickPorts
	if pick == nil {
		pick = testenv.FreePorts
	}
	ports, err := pick(1)
	if err != nil {
		return err
	}
	c.registryHost = fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n",
		filepath.Join(c.dir, "registry"), c.registryHost)
	if c.opts.RegistryAuth {
		htpasswd := filepath.Join(c.dir, "registry.htpasswd")
		if err := os.WriteFile(htpasswd, []byte(registryHtpasswd), 0o600); err != nil {
			return err
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: nodekit\n    path: %s\n", htpasswd)
	}
	cfgPath := filepath.Join(c.dir, "registry.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	p, err := testenv.StartProcess("docker-registry", filepath.Join(c.dir, "registry.log"), nil, "docker-registry", "serve", cfgPath)
	if err != nil {
		return err
	}
	c.registry = p
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	url := "http://" + c.registryHost + "/v2/"
	return p.WaitFor(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && !(c.opts.RegistryAuth && resp.StatusCode == http.StatusUnauthorized) {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		// Another test's registry answers /v2/ just the same: only the socket's owner
		// tells them apart.
		return p.CheckListening(ports[0])
	})
}

func (c *Containerd) cleanup(tb testing.TB) func() {
	return func() {
		if tb.Failed() && c.proc != nil {
			tb.Logf("--- containerd log tail ---\n%s", c.proc.Tail(4000))
		}
		if c.proc != nil {
			select {
			case <-c.proc.Exited():
				// Killed and not restarted: its containers still run under their shims.
				// Bring containerd back so CRI can stop them and CNI can release them.
				if err := c.start(tb); err != nil {
					tb.Logf("containerd cleanup: restart to remove sandboxes: %v", err)
				}
			default:
			}
			select {
			case <-c.proc.Exited():
			default:
				c.removeSandboxes(tb)
				c.proc.Stop(10 * time.Second)
			}
		}
		if c.registry != nil {
			c.registry.Stop(5 * time.Second)
		}
		c.killShims(tb)
		c.unmountAll(tb)
		if c.bridge != "" {
			if l, err := netlink.LinkByName(c.bridge); err == nil {
				if err := netlink.LinkDel(l); err != nil {
					tb.Errorf("containerd: delete bridge %s: %v", c.bridge, err)
				}
			}
		}
		if c.lock != nil {
			c.lock.Close()
		}
		if c.dir != "" {
			if err := os.RemoveAll(c.dir); err != nil {
				tb.Errorf("containerd: remove %s: %v", c.dir, err)
			}
		}
	}
}

// removeSandboxes stops and removes every pod sandbox so CNI DEL runs for each.
func (c *Containerd) removeSandboxes(tb testing.TB) {
	conn, err := grpc.NewClient("unix://"+c.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	resp, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		tb.Logf("containerd cleanup: list sandboxes: %v", err)
		return
	}
	stuck := 0
	for _, s := range resp.GetItems() {
		_, stopErr := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.GetId()})
		_, removeErr := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.GetId()})
		switch err := errors.Join(stopErr, removeErr); {
		case err == nil:
		case !c.opts.CNI && strings.Contains(err.Error(), "cni plugin not initialized"):
			// Without a CNI config containerd cannot tear down a failed pod-network
			// sandbox (RECIPES.md); stopping containerd and its shims covers it.
			stuck++
		default:
			tb.Logf("containerd cleanup: sandbox %s: %v", s.GetId(), err)
		}
	}
	if stuck > 0 {
		tb.Logf("containerd cleanup: %d sandbox(es) cannot be removed without CNI (expected); stopping containerd instead", stuck)
	}
}

// killShims kills the runc shims this run's containerd started: they run in their own
// process group and outlive containerd by design. They are found by the containerd
// address on their command line, which is unique to the run.
func (c *Containerd) killShims(tb testing.TB) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	needle := []byte(c.address)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("containerd-shim")) {
			continue
		}
		for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
			if bytes.Equal(arg, needle) {
				tb.Logf("containerd cleanup: killing leftover shim pid %d", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}

// unmountAll detaches every mount under the run's folder (rootfs overlays, sandbox
// /dev/shm, network namespace bind mounts), deepest first.
func (c *Containerd) unmountAll(tb testing.TB) {
	for range 3 {
		mounts := mountsUnder(c.dir)
		if len(mounts) == 0 {
			return
		}
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				tb.Logf("containerd cleanup: unmount %s: %v", m, err)
			}
		}
	}
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// Crictl returns the crictl binary hack/setup-containerd.sh built into
// NODEKIT_IMAGES_DIR, ending the test through testenv.Unavailable when it is missing.
func Crictl(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("NODEKIT_IMAGES_DIR")
	if dir == "" {
		testenv.Unavailable(tb, "NODEKIT_IMAGES_DIR is unset: export NODEKIT_IMAGES_DIR=$(hack/setup-containerd.sh)")
	}
	p := filepath.Join(dir, "crictl")
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		testenv.Unavailable(tb, "crictl not found in NODEKIT_IMAGES_DIR=%s (hack/setup-containerd.sh builds it with go)", dir)
	}
	return p
}

// CrictlArgs returns args prefixed with the flags that point crictl at this containerd
// (and at the run's own crictl.yaml rather than /etc/crictl.yaml).
func (c *Containerd) CrictlArgs(args ...string) []string {
	base := []string{"--config", filepath.Join(c.dir, "crictl.yaml"), "--runtime-endpoint", c.Endpoint(), "--image-endpoint", c.Endpoint(), "--timeout", "30s"}
	return append(base, args...)
}
