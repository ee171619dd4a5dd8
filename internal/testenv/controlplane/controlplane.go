// Package controlplane runs a real Kubernetes control plane for nodekit's tests: etcd
// (embedded-etcd main from upstream/cmd/etcd), kube-apiserver and, when asked,
// kube-controller-manager and kube-scheduler, all built by hack/build-peers.sh at v1.37.2 and listening on
// loopback at random ports.
//
// The API server runs with --authorization-mode=Node,RBAC and the NodeRestriction
// admission plugin, and trusts a test CA for client certificates. NodeClient hands out a
// client whose certificate says CN=system:node:NAME, O=system:nodes: the Node authorizer
// and NodeRestriction judge it exactly as they judge a real kubelet.
package controlplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// Options select what runs beside etcd and kube-apiserver.
type Options struct {
	// ControllerManager starts kube-controller-manager with the node-lifecycle,
	// endpointslice and serviceaccount controllers.
	ControllerManager bool
	// NodeMonitorGracePeriod is kube-controller-manager's --node-monitor-grace-period.
	// Zero means 10s (upstream's default is 50s; tests want it short).
	NodeMonitorGracePeriod time.Duration
	// NodeMonitorPeriod is kube-controller-manager's --node-monitor-period. Zero means 1s.
	NodeMonitorPeriod time.Duration
	// Controllers replaces kube-controller-manager's --controllers list (for example
	// adding deployment-controller and replicaset-controller). Empty means
	// node-lifecycle-controller, endpointslice-controller and serviceaccount-controller.
	Controllers []string
	// Scheduler starts kube-scheduler, so pods without nodeName get bound.
	Scheduler bool
	// ClusterSigningDuration is kube-controller-manager's --cluster-signing-duration,
	// the lifetime of the certificates its csrsigning controller issues (short ones
	// test rotation). Zero means upstream's default, 8760h.
	ClusterSigningDuration time.Duration
	// ClusterEgress, when set, routes kube-apiserver's traffic to the cluster (kubelet
	// API calls for logs, exec, attach and port-forward; proxying to nodes, pods and
	// services) through an HTTP CONNECT proxy on a unix socket that the harness serves
	// (--egress-selector-config-file with egress "cluster", as konnectivity does). The
	// proxy dials each CONNECT's host:port with ClusterEgress: a test dials from inside
	// the node's network namespace, so node addresses stay what the kubelet reports and
	// need no route from the host.
	ClusterEgress func(ctx context.Context, address string) (net.Conn, error)
	// ServiceCIDR6, when set, is a second, IPv6 --service-cluster-ip-range
	// (a prefix of /108 or longer), so Services may be IPv6 or dual-stack
	// (ipFamilyPolicy RequireDualStack). Empty keeps the API server IPv4-only.
	ServiceCIDR6 string

	// pickPorts chooses n ports (etcd client, etcd peer, kube-apiserver,
	// kube-controller-manager, kube-scheduler). Nil means testenv.FreePorts; tests of
	// the retry hand out a taken port.
	pickPorts func(n int) ([]int, error)
}

// KubeletClientUser is the user kube-apiserver authenticates as when it calls a
// kubelet (--kubelet-client-certificate), in group system:masters.
const KubeletClientUser = "kube-apiserver-kubelet-client"

// ServiceCIDR is the --service-cluster-ip-range the API server allocates ClusterIPs from.
const ServiceCIDR = "10.96.0.0/16"

const startTimeout = 60 * time.Second

// ControlPlane is a running etcd + kube-apiserver (+ kube-controller-manager).
type ControlPlane struct {
	opts         Options
	dir          string
	ca           *authority
	apiPort      int
	kcmPort      int
	schedPort    int
	etcdPort     int
	etcdPeerPort int
	etcdURL      string
	egressConfig string
	egress       *egressProxy

	adminConfig *rest.Config
	admin       kubernetes.Interface

	stopOnce  sync.Once
	mu        sync.Mutex
	etcd      *testenv.Process
	apiserver *testenv.Process
	kcm       *testenv.Process
	scheduler *testenv.Process
}

// maxStartAttempts bounds how often Start starts again after losing a port race.
const maxStartAttempts = 3

// Start starts a control plane for tb and stops it, removing all its state, on
// tb.Cleanup. A missing peer binary ends the test through testenv.Unavailable.
//
// The ports come from testenv.FreePorts, free when chosen; another process may bind
// one first. A start that loses a port (a peer exits with "address already in use",
// or the server answering on a port is not the peer this start ran: a listener of
// another process, or an API server whose certificate this one did not make) is
// stopped, its folder removed, and the whole start runs again on fresh ports, up to
// maxStartAttempts times; each retry is logged with tb.Logf and its reason.
func Start(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	testenv.RequireLong(tb)
	bins := map[string]string{}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		bins[name] = testenv.PeerBinary(tb, name)
	}
	if opts.Scheduler {
		bins["kube-scheduler"] = testenv.PeerBinary(tb, "kube-scheduler")
	}
	if opts.NodeMonitorGracePeriod == 0 {
		opts.NodeMonitorGracePeriod = 10 * time.Second
	}
	if opts.NodeMonitorPeriod == 0 {
		opts.NodeMonitorPeriod = time.Second
	}
	if opts.pickPorts == nil {
		opts.pickPorts = testenv.FreePorts
	}
	for attempt := 1; ; attempt++ {
		dir, err := os.MkdirTemp("", "nodekit-controlplane-")
		if err != nil {
			tb.Fatalf("control plane: %v", err)
		}
		cp := &ControlPlane{opts: opts, dir: dir}
		// Registered before anything starts, so a failed or abandoned attempt is
		// stopped too; stop runs once however often it is called.
		tb.Cleanup(cp.stop)
		msg, err := cp.start(bins)
		if err == nil {
			if attempt > 1 {
				msg += fmt.Sprintf(", attempt %d", attempt)
			}
			tb.Logf("%s", msg)
			return cp
		}
		if !errors.Is(err, testenv.ErrPortTaken) || attempt == maxStartAttempts {
			tb.Fatalf("control plane (attempt %d of %d): %v", attempt, maxStartAttempts, err)
		}
		cp.stop()
		tb.Logf("control plane: attempt %d of %d lost a port race; stopped it, removed %s, starting again on fresh ports: %v", attempt, maxStartAttempts, dir, err)
	}
}

// start runs one attempt; it returns the timings line for the log.
func (cp *ControlPlane) start(bins map[string]string) (string, error) {
	begin := time.Now()
	if err := cp.setup(); err != nil {
		return "", err
	}
	if err := cp.startEtcd(bins["etcd"]); err != nil {
		return "", err
	}
	etcdReady := time.Since(begin)
	if err := cp.startAPIServer(bins["kube-apiserver"]); err != nil {
		return "", err
	}
	apiReady := time.Since(begin)
	if err := cp.bootstrap(); err != nil {
		return "", err
	}
	msg := fmt.Sprintf("control plane: etcd ready in %s, kube-apiserver /readyz in %s", etcdReady.Round(time.Millisecond), (apiReady - etcdReady).Round(time.Millisecond))
	if cp.opts.ControllerManager {
		kcmBegin := time.Now()
		if err := cp.startControllerManager(bins["kube-controller-manager"]); err != nil {
			return "", err
		}
		msg += fmt.Sprintf(", kube-controller-manager /healthz in %s", time.Since(kcmBegin).Round(time.Millisecond))
	}
	if cp.opts.Scheduler {
		schedBegin := time.Now()
		if err := cp.startScheduler(bins["kube-scheduler"]); err != nil {
			return "", err
		}
		msg += fmt.Sprintf(", kube-scheduler /healthz in %s", time.Since(schedBegin).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s (total %s)", msg, time.Since(begin).Round(time.Millisecond)), nil
}

func (cp *ControlPlane) setup() error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	cp.ca = ca
	for _, d := range []string{"etcd", "apiserver-certs", "logs"} {
		if err := os.MkdirAll(filepath.Join(cp.dir, d), 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(cp.path("ca.crt"), ca.certPEM, 0o600); err != nil {
		return err
	}
	caKeyPEM, err := ca.keyPEM()
	if err != nil {
		return err
	}
	// kube-controller-manager's csrsigning controller signs with the same CA, so a
	// certificate a kubelet obtains through a CSR is trusted like the harness's own.
	if err := os.WriteFile(cp.path("ca.key"), caKeyPEM, 0o600); err != nil {
		return err
	}
	// The identity kube-apiserver presents to kubelets (logs, exec, port-forward), as
	// kubeadm's apiserver-kubelet-client certificate.
	kcCert, kcKey, err := ca.clientCert(KubeletClientUser, "system:masters")
	if err != nil {
		return err
	}
	if err := os.WriteFile(cp.path("apiserver-kubelet-client.crt"), kcCert, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(cp.path("apiserver-kubelet-client.key"), kcKey, 0o600); err != nil {
		return err
	}
	if err := writeServiceAccountKey(cp.path("sa.key")); err != nil {
		return err
	}
	ports, err := cp.opts.pickPorts(5)
	if err != nil {
		return err
	}
	cp.etcdPort = ports[0]
	cp.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	cp.apiPort, cp.kcmPort, cp.schedPort = ports[2], ports[3], ports[4]

	certPEM, keyPEM, err := ca.clientCert("nodekit-admin", "system:masters")
	if err != nil {
		return err
	}
	// The admin clientset is made once kube-apiserver has written the serving
	// certificate it verifies against (see readyz).
	cp.adminConfig = cp.restConfig(certPEM, keyPEM)
	if err := cp.writeKubeconfig(cp.path("admin.kubeconfig"), certPEM, keyPEM); err != nil {
		return err
	}
	cp.etcdPeerPort = ports[1]
	if cp.opts.ClusterEgress != nil {
		if cp.egressConfig, err = cp.startEgress(); err != nil {
			return err
		}
	}
	return nil
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.dir, name) }

// URL is the API server's address, https://127.0.0.1:PORT.
func (cp *ControlPlane) URL() string { return "https://127.0.0.1:" + strconv.Itoa(cp.apiPort) }

// Dir is the folder holding the control plane's state and logs (logs/*.log).
func (cp *ControlPlane) Dir() string { return cp.dir }

func (cp *ControlPlane) restConfig(certPEM, keyPEM []byte) *rest.Config {
	return &rest.Config{
		Host: cp.URL(),
		TLSClientConfig: rest.TLSClientConfig{
			// The serving certificate is the one kube-apiserver made itself in --cert-dir;
			// it is read once it exists (see startAPIServer).
			CAFile:   filepath.Join(cp.dir, "apiserver-certs", "apiserver.crt"),
			CertData: certPEM,
			KeyData:  keyPEM,
		},
		QPS:   -1, // no client-side rate limit: tests measure the server, not the limiter
		Burst: -1,
	}
}

func (cp *ControlPlane) writeKubeconfig(path string, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{
		Server:               cp.URL(),
		CertificateAuthority: filepath.Join(cp.dir, "apiserver-certs", "apiserver.crt"),
	}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

func (cp *ControlPlane) startEtcd(bin string) error {
	hostport := strings.TrimPrefix(cp.etcdURL, "http://")
	p, err := testenv.StartProcess("etcd", cp.path("logs/etcd.log"), nil, bin,
		"--data-dir="+cp.path("etcd"),
		"--listen-client-urls="+cp.etcdURL,
		"--listen-peer-urls=http://127.0.0.1:"+strconv.Itoa(cp.etcdPeerPort),
		"--unsafe-no-fsync",
	)
	if err != nil {
		return err
	}
	cp.etcd = p
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return p.WaitFor(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", hostport)
		if err != nil {
			return err
		}
		c.Close()
		// Something answered, but etcd speaks plain HTTP without an identity: only
		// the socket's owner tells this etcd from another test's on a port both chose.
		return p.CheckListening(cp.etcdPort, cp.etcdPeerPort)
	})
}

func (cp *ControlPlane) apiserverArgs() []string {
	args := []string{
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.apiPort),
		"--cert-dir=" + cp.path("apiserver-certs"),
		"--client-ca-file=" + cp.path("ca.crt"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=" + cp.serviceCIDRs(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + cp.path("sa.key"),
		"--service-account-signing-key-file=" + cp.path("sa.key"),
		"--allow-privileged=true",
		"--enable-bootstrap-token-auth=true",
		"--kubelet-client-certificate=" + cp.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + cp.path("apiserver-kubelet-client.key"),
		// Test nodes' hostnames do not resolve; their InternalIP is where the kubelet listens.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
	}
	if cp.egressConfig != "" {
		args = append(args, "--egress-selector-config-file="+cp.egressConfig)
	}
	return args
}

func (cp *ControlPlane) startAPIServer(bin string) error {
	p, err := testenv.StartProcess("kube-apiserver", cp.path("logs/kube-apiserver.log"), nil, bin, cp.apiserverArgs()...)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apiserver = p
	cp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return p.WaitFor(ctx, 100*time.Millisecond, cp.readyz)
}

// readyz asks /readyz as the admin, verifying the serving certificate the API server made.
func (cp *ControlPlane) readyz(ctx context.Context) error {
	admin := cp.admin
	if admin == nil {
		// Until one attempt succeeds, each makes a fresh client from the CA bundle read
		// whole: kube-apiserver writes the file in place, and a client that read half of
		// it (the serving certificate without its CA) fails every later attempt with
		// "certificate signed by unknown authority". Read whole, an unknown authority
		// is certain: the server on the port is not the one that wrote the file.
		caPEM, err := cp.servingCA()
		if err != nil {
			return err
		}
		cfg := rest.CopyConfig(cp.adminConfig)
		cfg.CAFile, cfg.CAData = "", caPEM
		if admin, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
	}
	// Each attempt gets its own short deadline: a request that hangs while the server
	// is starting must not use up the whole start-up wait (seen once in CI-like runs).
	attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	body, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(attempt)
	if err != nil {
		var unknownCA x509.UnknownAuthorityError
		if errors.As(err, &unknownCA) {
			return fmt.Errorf("%w: the server on 127.0.0.1:%d presents a certificate this kube-apiserver did not make (%v)", testenv.ErrPortTaken, cp.apiPort, err)
		}
		return fmt.Errorf("/readyz: %w (%s)", err, body)
	}
	if string(body) != "ok" {
		return fmt.Errorf("/readyz said %q", body)
	}
	if cp.admin == nil {
		cp.admin = admin
	}
	return nil
}

// servingCA returns kube-apiserver's self-signed serving bundle (its certificate and
// the CA that signed it) once the file holds the CA.
func (cp *ControlPlane) servingCA() ([]byte, error) {
	caPEM, err := os.ReadFile(cp.adminConfig.CAFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate not written yet: %w", err)
	}
	remaining := caPEM
	for {
		var block *pem.Block
		if block, remaining = pem.Decode(remaining); block == nil {
			return nil, fmt.Errorf("serving certificate %s does not hold its CA yet", cp.adminConfig.CAFile)
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && c.IsCA {
			return caPEM, nil
		}
	}
}

// bootstrap creates what a cluster's add-ons would: the default service account, so
// pods can be created before (or without) kube-controller-manager.
func (cp *ControlPlane) bootstrap() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	for {
		_, err := cp.admin.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Create(ctx, sa, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		// The default namespace appears a moment after /readyz.
		select {
		case <-ctx.Done():
			return fmt.Errorf("create default service account: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (cp *ControlPlane) startControllerManager(bin string) error {
	kubeconfig := cp.path("admin.kubeconfig")
	p, err := testenv.StartProcess("kube-controller-manager", cp.path("logs/kube-controller-manager.log"), nil, bin,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(cp.kcmPort),
		"--cert-dir="+cp.path("kcm-certs"),
		"--leader-elect=false",
		"--controllers="+cp.controllers(),
		"--node-monitor-period="+cp.opts.NodeMonitorPeriod.String(),
		"--node-monitor-grace-period="+cp.opts.NodeMonitorGracePeriod.String(),
		"--service-account-private-key-file="+cp.path("sa.key"),
		"--cluster-signing-cert-file="+cp.path("ca.crt"),
		"--cluster-signing-key-file="+cp.path("ca.key"),
		"--cluster-signing-duration="+cp.clusterSigningDuration().String(),
		// The root CA the root-ca-certificate-publisher puts in kube-root-ca.crt
		// (without it the kubeconfig's CA, a file here, is not read and pods'
		// projected ca.crt comes out empty).
		"--root-ca-file="+filepath.Join(cp.dir, "apiserver-certs", "apiserver.crt"),
	)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.kcm = p
	cp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	// kube-controller-manager serves /healthz with its own self-signed certificate and
	// allows /healthz without authentication, so a plain TLS GET is enough.
	return p.WaitFor(ctx, 100*time.Millisecond, healthz(p, cp.kcmPort))
}

func (cp *ControlPlane) clusterSigningDuration() time.Duration {
	if cp.opts.ClusterSigningDuration > 0 {
		return cp.opts.ClusterSigningDuration
	}
	return 365 * 24 * time.Hour
}

// serviceCIDRs is --service-cluster-ip-range: ServiceCIDR, then ServiceCIDR6 when set.
func (cp *ControlPlane) serviceCIDRs() string {
	if cp.opts.ServiceCIDR6 != "" {
		return ServiceCIDR + "," + cp.opts.ServiceCIDR6
	}
	return ServiceCIDR
}

func (cp *ControlPlane) controllers() string {
	if len(cp.opts.Controllers) > 0 {
		return strings.Join(cp.opts.Controllers, ",")
	}
	return "node-lifecycle-controller,endpointslice-controller,serviceaccount-controller"
}

func (cp *ControlPlane) startScheduler(bin string) error {
	kubeconfig := cp.path("admin.kubeconfig")
	p, err := testenv.StartProcess("kube-scheduler", cp.path("logs/kube-scheduler.log"), nil, bin,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(cp.schedPort),
		"--cert-dir="+cp.path("scheduler-certs"),
		"--leader-elect=false",
	)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.scheduler = p
	cp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return p.WaitFor(ctx, 100*time.Millisecond, healthz(p, cp.schedPort))
}

// AdminKubeconfig is the path of a kubeconfig file in system:masters (for kubectl).
func (cp *ControlPlane) AdminKubeconfig() string { return cp.path("admin.kubeconfig") }

// WriteNodeKubeconfig writes a kubeconfig with nodeName's kubelet identity
// (system:node:NAME in system:nodes) to path. server replaces the API server's URL
// when set: a forwarder in front of it must present the same name (127.0.0.1), as
// the serving certificate is verified.
func (cp *ControlPlane) WriteNodeKubeconfig(tb testing.TB, path, nodeName, server string) {
	tb.Helper()
	certPEM, keyPEM, err := cp.ca.clientCert("system:node:"+nodeName, "system:nodes")
	if err != nil {
		tb.Fatalf("control plane: node certificate for %s: %v", nodeName, err)
	}
	if server == "" {
		server = cp.URL()
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{
		Server:               server,
		CertificateAuthority: filepath.Join(cp.dir, "apiserver-certs", "apiserver.crt"),
	}
	cfg.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "node"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		tb.Fatalf("control plane: write node kubeconfig: %v", err)
	}
}

// CAFile is the cluster CA: the API server's --client-ca-file and the signer of
// kube-controller-manager's CSRs. A kubelet's authentication.x509.clientCAFile
// points here to trust kube-apiserver's kubelet client certificate.
func (cp *ControlPlane) CAFile() string { return cp.path("ca.crt") }

// UserConfig is a client configuration for user in groups, signed by the cluster CA
// (for tests of who may and may not do something).
func (cp *ControlPlane) UserConfig(tb testing.TB, user string, groups ...string) *rest.Config {
	tb.Helper()
	certPEM, keyPEM, err := cp.ca.clientCert(user, groups...)
	if err != nil {
		tb.Fatalf("control plane: certificate for %s: %v", user, err)
	}
	return cp.restConfig(certPEM, keyPEM)
}

// WriteUserKubeconfig writes a kubeconfig for user in groups to path.
func (cp *ControlPlane) WriteUserKubeconfig(tb testing.TB, path, user string, groups ...string) {
	tb.Helper()
	certPEM, keyPEM, err := cp.ca.clientCert(user, groups...)
	if err != nil {
		tb.Fatalf("control plane: certificate for %s: %v", user, err)
	}
	if err := cp.writeKubeconfig(path, certPEM, keyPEM); err != nil {
		tb.Fatalf("control plane: write kubeconfig for %s: %v", user, err)
	}
}

// AdminConfig is a client configuration in system:masters.
func (cp *ControlPlane) AdminConfig() *rest.Config { return rest.CopyConfig(cp.adminConfig) }

// AdminClient is a clientset in system:masters.
func (cp *ControlPlane) AdminClient() kubernetes.Interface { return cp.admin }

// NodeConfig is a client configuration whose identity is system:node:NAME in group
// system:nodes, the identity a kubelet on that node has.
func (cp *ControlPlane) NodeConfig(nodeName string) *rest.Config {
	certPEM, keyPEM, err := cp.ca.clientCert("system:node:"+nodeName, "system:nodes")
	if err != nil {
		// Only crypto/rand failing gets here; there is nothing a test could do.
		panic(fmt.Sprintf("control plane: node certificate for %s: %v", nodeName, err))
	}
	return cp.restConfig(certPEM, keyPEM)
}

// NodeClient is a clientset with the identity of the kubelet on nodeName.
func (cp *ControlPlane) NodeClient(nodeName string) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(cp.NodeConfig(nodeName))
}

// CreateNode registers a Node named name with that node's own identity, as a kubelet
// does, and returns it.
func (cp *ControlPlane) CreateNode(tb testing.TB, name string) *corev1.Node {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{corev1.LabelHostname: name},
	}}
	created, err := cp.NodeClient(name).CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("control plane: create node %s as system:node:%s: %v", name, name, err)
	}
	return created
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 10s); etcd keeps running.
func (cp *ControlPlane) StopAPIServer(tb testing.TB) {
	tb.Helper()
	cp.stopPeer(tb, &cp.apiserver, "kube-apiserver")
}

// stopPeer stops the process in *slot and clears it; a slot already empty fails the test.
func (cp *ControlPlane) stopPeer(tb testing.TB, slot **testenv.Process, name string) {
	tb.Helper()
	cp.mu.Lock()
	p := *slot
	*slot = nil
	cp.mu.Unlock()
	if p == nil {
		tb.Fatalf("control plane: %s is not running", name)
	}
	p.Stop(10 * time.Second)
}

// StartAPIServer starts kube-apiserver again on the same port with the same flags and
// waits until /readyz answers.
func (cp *ControlPlane) StartAPIServer(tb testing.TB) {
	tb.Helper()
	begin := time.Now()
	if err := cp.startAPIServer(testenv.PeerBinary(tb, "kube-apiserver")); err != nil {
		tb.Fatalf("control plane: restart kube-apiserver: %v", err)
	}
	tb.Logf("control plane: kube-apiserver restarted, /readyz in %s", time.Since(begin).Round(time.Millisecond))
}

// StopControllerManager stops kube-controller-manager.
func (cp *ControlPlane) StopControllerManager(tb testing.TB) {
	tb.Helper()
	cp.stopPeer(tb, &cp.kcm, "kube-controller-manager")
}

// StartControllerManager starts kube-controller-manager (again) with the same flags.
func (cp *ControlPlane) StartControllerManager(tb testing.TB) {
	tb.Helper()
	if err := cp.startControllerManager(testenv.PeerBinary(tb, "kube-controller-manager")); err != nil {
		tb.Fatalf("control plane: start kube-controller-manager: %v", err)
	}
}

func (cp *ControlPlane) stop() { cp.stopOnce.Do(cp.stopAll) }

func (cp *ControlPlane) stopAll() {
	cp.mu.Lock()
	procs := []*testenv.Process{cp.scheduler, cp.kcm, cp.apiserver, cp.etcd}
	cp.scheduler, cp.kcm, cp.apiserver, cp.etcd = nil, nil, nil, nil
	cp.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if cp.egress != nil {
		cp.egress.stop()
	}
	if err := os.RemoveAll(cp.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "control plane: remove %s: %v\n", cp.dir, err)
	}
}
