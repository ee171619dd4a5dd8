package main_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// The bootstrap token these tests join with, in kubeadm's format.
const (
	bootstrapTokenID     = "abcdef"
	bootstrapTokenSecret = "0123456789abcdef"
	// kubeadm's extra group for node bootstrap tokens.
	nodeBootstrapGroup = "system:bootstrappers:kubeadm:default-node-token"
)

// joinControllers are the kube-controller-manager controllers a kubeadm cluster
// runs for joining nodes (csrapproving, csrsigning, csrcleaner, tokencleaner,
// bootstrapsigner), plus node-lifecycle for Ready.
var joinControllers = []string{
	"node-lifecycle-controller",
	"certificatesigningrequest-approving-controller",
	"certificatesigningrequest-signing-controller",
	"certificatesigningrequest-cleaner-controller",
	"token-cleaner-controller",
	"bootstrap-signer-controller",
}

// kubeadmJoinObjects creates what `kubeadm init` / `kubeadm token create` leave for a
// joining node: a bootstrap-token Secret and the three ClusterRoleBindings that let
// its group request node client certificates (auto-approved) and let nodes renew
// their own.
func kubeadmJoinObjects(t testing.TB, admin kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	_, err := admin.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + bootstrapTokenID, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"description":                    "nodekit join test",
			"token-id":                       bootstrapTokenID,
			"token-secret":                   bootstrapTokenSecret,
			"expiration":                     time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              nodeBootstrapGroup,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, b := range []struct{ name, role, group string }{
		{"kubeadm:kubelet-bootstrap", "system:node-bootstrapper", nodeBootstrapGroup},
		{"kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", nodeBootstrapGroup},
		{"kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
	} {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.group}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// startJoiningNode is startNode for a node that has only a bootstrap kubeconfig: no
// --kubeconfig file exists when the kubelet starts.
func startJoiningNode(t *testing.T, cp *controlplane.ControlPlane, name, extraConfig string) *testNode {
	t.Helper()
	n := &testNode{name: name, cp: cp, admin: cp.AdminClient()}
	n.env = netns.New(t, netns.Config{Pods: 1})
	n.ctd = containerd.Start(t, containerd.Options{CNI: true, NetNS: n.env.Node.Path()})
	fwd := n.env.Node.Forward(t, strings.TrimPrefix(cp.URL(), "https://"))
	dir, err := os.MkdirTemp("", "nk-kubelet-join-")
	require.NoError(t, err)
	t.Cleanup(func() {
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	n.dir = dir
	bk := clientcmdapi.NewConfig()
	bk.Clusters["kubernetes"] = &clientcmdapi.Cluster{
		Server:               "https://" + fwd,
		CertificateAuthority: filepath.Join(cp.Dir(), "apiserver-certs", "apiserver.crt"),
	}
	bk.AuthInfos["tls-bootstrap-token-user"] = &clientcmdapi.AuthInfo{Token: bootstrapTokenID + "." + bootstrapTokenSecret}
	bk.Contexts["tls-bootstrap-token-user@kubernetes"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: "tls-bootstrap-token-user"}
	bk.CurrentContext = "tls-bootstrap-token-user@kubernetes"
	require.NoError(t, clientcmd.WriteToFile(*bk, filepath.Join(dir, "bootstrap-kubelet.conf")))
	cfg := withTestEvictionHard(nodeConfig + extraConfig + fmt.Sprintf("podLogsDir: %s\nstaticPodPath: %s\n", filepath.Join(dir, "logs"), filepath.Join(dir, "manifests")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "manifests"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600))
	n.args = []string{
		"--net=" + n.env.Node.Path(), kubeletBin,
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--bootstrap-kubeconfig=" + filepath.Join(dir, "bootstrap-kubelet.conf"),
		"--kubeconfig=" + filepath.Join(dir, "kubelet.conf"),
		"--hostname-override=" + name,
		"--node-ip=" + n.env.NodeIP.String(),
		"--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "root", "pki"),
		"--container-runtime-endpoint=" + n.ctd.Endpoint(),
		"-v=" + verbosity(),
	}
	n.startKubelet(t)
	t.Cleanup(func() {
		n.kubelet.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("--- kubelet log tail ---\n%s", n.kubelet.Tail(8000))
		}
		if b, err := os.ReadFile(filepath.Join(dir, "kubelet.log")); err == nil && strings.Contains(string(b), "WARNING: DATA RACE") {
			t.Errorf("the kubelet reported a data race:\n%s", b[strings.Index(string(b), "WARNING: DATA RACE"):])
		}
	})
	return n
}

// csrsFor lists the CSRs for signer requested by user.
func csrsFor(t testing.TB, admin kubernetes.Interface, signer, user string) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	l, err := admin.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []certificatesv1.CertificateSigningRequest
	for _, c := range l.Items {
		if c.Spec.SignerName == signer && c.Spec.Username == user {
			out = append(out, c)
		}
	}
	return out
}

func csrCondition(c *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == typ {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// readPEMCert parses the first certificate of a PEM file (a pair file holds the key too).
func readPEMCert(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		require.NotNil(t, blk, "no certificate in %s", path)
		if blk.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(blk.Bytes)
			require.NoError(t, err)
			return c
		}
	}
}

// TestKubeletJoin joins a node the way `kubeadm join` does: the control plane runs
// kube-controller-manager's CSR approving and signing controllers, the cluster holds
// a bootstrap token and kubeadm's RBAC, and the kubelet binary starts with only a
// bootstrap kubeconfig (rotateCertificates and serverTLSBootstrap on, as kubeadm
// configures them). Certificates live 150 s, so the client certificate is rotated
// within the test.
func TestKubeletJoin(t *testing.T) {
	const signingDuration = 150 * time.Second
	cp := controlplane.Start(t, controlplane.Options{
		ControllerManager: true, Controllers: joinControllers, ClusterSigningDuration: signingDuration,
	})
	admin := cp.AdminClient()
	kubeadmJoinObjects(t, admin)
	begin := time.Now()
	n := startJoiningNode(t, cp, "join-a", "rotateCertificates: true\nserverTLSBootstrap: true\n")
	nodeUser := "system:node:" + n.name
	pki := filepath.Join(n.dir, "root", "pki")
	clientSigner := certificatesv1.KubeAPIServerClientKubeletSignerName

	var first *x509.Certificate
	t.Run("the bootstrap CSR is approved by csrapproving and signed", func(t *testing.T) {
		var csr certificatesv1.CertificateSigningRequest
		eventually(t, 60*time.Second, "an issued bootstrap CSR", func() (bool, string) {
			l := csrsFor(t, admin, clientSigner, "system:bootstrap:"+bootstrapTokenID)
			if len(l) == 0 {
				return false, "no CSR yet"
			}
			csr = l[0]
			return len(csr.Status.Certificate) > 0, fmt.Sprintf("%d CSRs, conditions %+v", len(l), csr.Status.Conditions)
		})
		t.Logf("bootstrap CSR %s issued %s after the kubelet started", csr.Name, time.Since(begin).Round(time.Millisecond))
		approved := csrCondition(&csr, certificatesv1.CertificateApproved)
		require.NotNil(t, approved)
		assert.Equal(t, "AutoApproved", approved.Reason)
		assert.Contains(t, csr.Spec.Groups, nodeBootstrapGroup)
		assert.Contains(t, csr.Spec.Usages, certificatesv1.UsageClientAuth)
		assert.Contains(t, csr.Spec.Usages, certificatesv1.UsageDigitalSignature)
		req, _ := pem.Decode(csr.Spec.Request)
		require.NotNil(t, req)
		xr, err := x509.ParseCertificateRequest(req.Bytes)
		require.NoError(t, err)
		assert.Equal(t, nodeUser, xr.Subject.CommonName)
		assert.Equal(t, []string{"system:nodes"}, xr.Subject.Organization)
	})

	t.Run("the kubeconfig and the certificate files are written", func(t *testing.T) {
		current := filepath.Join(pki, "kubelet-client-current.pem")
		eventually(t, 30*time.Second, "kubelet.conf", func() (bool, string) {
			_, err := os.Stat(filepath.Join(n.dir, "kubelet.conf"))
			return err == nil, fmt.Sprint(err)
		})
		kc, err := clientcmd.LoadFromFile(filepath.Join(n.dir, "kubelet.conf"))
		require.NoError(t, err)
		require.Equal(t, "default-context", kc.CurrentContext)
		auth := kc.AuthInfos["default-auth"]
		require.NotNil(t, auth)
		assert.Equal(t, current, auth.ClientCertificate)
		assert.Equal(t, current, auth.ClientKey)
		assert.Empty(t, auth.Token, "the bootstrap token must not be in the kubelet's kubeconfig")
		assert.True(t, strings.HasPrefix(kc.Clusters["default-cluster"].Server, "https://127.0.0.1:"))
		target, err := os.Readlink(current)
		require.NoError(t, err)
		assert.Regexp(t, `^kubelet-client-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}\.pem$`, filepath.Base(target))
		first = readPEMCert(t, current)
		assert.Equal(t, nodeUser, first.Subject.CommonName)
		assert.Equal(t, []string{"system:nodes"}, first.Subject.Organization)
		ca := readPEMCert(t, cp.CAFile())
		require.NoError(t, first.CheckSignatureFrom(ca), "the client certificate is signed by the cluster CA")
		t.Logf("client certificate serial %s valid %s .. %s", first.SerialNumber, first.NotBefore.Format(time.TimeOnly), first.NotAfter.Format(time.TimeOnly))
	})
	require.NotNil(t, first)

	t.Run("the node reaches Ready as system:node:NAME", func(t *testing.T) {
		// Under Node,RBAC and NodeRestriction only system:node:join-a may create and
		// update Node join-a; the bootstrap token's groups may not touch Nodes at all.
		node := n.waitReady(t, corev1.ConditionTrue, 90*time.Second)
		t.Logf("node Ready %s after the kubelet started", time.Since(begin).Round(time.Millisecond))
		assert.Equal(t, "KubeletReady", nodeCondition(node, corev1.NodeReady).Reason)
		// The credentials the kubelet wrote, used from the test (the server is the
		// API server itself rather than the node namespace's forwarder).
		rc, err := clientcmd.BuildConfigFromFlags(cp.URL(), filepath.Join(n.dir, "kubelet.conf"))
		require.NoError(t, err)
		cs, err := kubernetes.NewForConfig(rc)
		require.NoError(t, err)
		ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Equal(t, nodeUser, ssr.Status.UserInfo.Username)
		assert.Contains(t, ssr.Status.UserInfo.Groups, "system:nodes")
	})

	t.Run("the serving CSR waits for an administrator, then is used", func(t *testing.T) {
		var csr certificatesv1.CertificateSigningRequest
		eventually(t, 30*time.Second, "a kubelet-serving CSR", func() (bool, string) {
			l := csrsFor(t, admin, certificatesv1.KubeletServingSignerName, nodeUser)
			if len(l) == 0 {
				return false, "none yet"
			}
			csr = l[0]
			return true, ""
		})
		// kube-controller-manager does not approve serving CSRs, as upstream.
		time.Sleep(3 * time.Second)
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), csr.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Nil(t, csrCondition(got, certificatesv1.CertificateApproved), "a serving CSR was approved without an administrator")
		assert.Empty(t, got.Status.Certificate)
		_, err = os.Stat(filepath.Join(pki, "kubelet-server-current.pem"))
		assert.ErrorIs(t, err, os.ErrNotExist)

		got.Status.Conditions = append(got.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
			Reason: "TestApproved", Message: "approved by the join test as admin",
		})
		_, err = admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(context.Background(), got.Name, got, metav1.UpdateOptions{})
		require.NoError(t, err)
		serving := filepath.Join(pki, "kubelet-server-current.pem")
		eventually(t, 60*time.Second, "kubelet-server-current.pem", func() (bool, string) {
			_, err := os.Stat(serving)
			return err == nil, fmt.Sprint(err)
		})
		c := readPEMCert(t, serving)
		assert.Equal(t, nodeUser, c.Subject.CommonName)
		assert.Equal(t, []string{"system:nodes"}, c.Subject.Organization)
		assert.Contains(t, c.DNSNames, n.name)
		var ips []string
		for _, ip := range c.IPAddresses {
			ips = append(ips, ip.String())
		}
		assert.Contains(t, ips, n.env.NodeIP.String())
		assert.Contains(t, c.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	})

	t.Run("the client certificate is rotated with no gap in heartbeats", func(t *testing.T) {
		// Sample the Lease until well past the first certificate's expiry: renewals
		// after that can only be authenticated with a renewed certificate.
		until := first.NotAfter.Add(15 * time.Second)
		var (
			lastRenew time.Time
			maxGap    time.Duration
			renewals  int
			rotatedAt time.Time
			newSerial string
		)
		for time.Now().Before(until) {
			l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), n.name, metav1.GetOptions{})
			require.NoError(t, err)
			if rt := l.Spec.RenewTime; rt != nil && rt.Time.After(lastRenew) {
				if !lastRenew.IsZero() && rt.Time.Sub(lastRenew) > maxGap {
					maxGap = rt.Time.Sub(lastRenew)
				}
				lastRenew = rt.Time
				renewals++
			}
			if rotatedAt.IsZero() {
				if c := readPEMCert(t, filepath.Join(pki, "kubelet-client-current.pem")); c.SerialNumber.Cmp(first.SerialNumber) != 0 {
					rotatedAt, newSerial = time.Now(), c.SerialNumber.String()
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		require.False(t, rotatedAt.IsZero(), "the client certificate was not renewed before the first one expired at %s", first.NotAfter)
		t.Logf("client certificate renewed at %s (%.0f%% of its %s life incl. the signer's 5m backdate), new serial %s; %d lease renewals, largest gap %s",
			rotatedAt.Format(time.TimeOnly), 100*float64(rotatedAt.Sub(first.NotBefore))/float64(first.NotAfter.Sub(first.NotBefore)),
			first.NotAfter.Sub(first.NotBefore), newSerial, renewals, maxGap)
		assert.True(t, lastRenew.After(first.NotAfter.Add(5*time.Second)), "no lease renewal after the first certificate expired (last %s, expiry %s)", lastRenew, first.NotAfter)
		// nodeStatusUpdateFrequency 2s, lease duration 8s: renewals every 2s.
		assert.Less(t, maxGap, 6*time.Second, "heartbeat gap")
		select {
		case <-n.kubelet.Exited():
			t.Fatal("the kubelet exited")
		default:
		}
		assert.NotContains(t, n.log(t), "Exiting")
		renewalsBy := csrsFor(t, admin, clientSigner, nodeUser)
		require.NotEmpty(t, renewalsBy, "no renewal CSR made as the node")
		approved := csrCondition(&renewalsBy[0], certificatesv1.CertificateApproved)
		require.NotNil(t, approved, "renewal CSR %s not approved", renewalsBy[0].Name)
		assert.Equal(t, "AutoApproved", approved.Reason)
		// Once for the first certificate, once more for each renewal.
		assert.GreaterOrEqual(t, strings.Count(n.log(t), "Certificate rotation detected, shutting down client connections"), 2)
		node := n.waitReady(t, corev1.ConditionTrue, 5*time.Second)
		assert.Equal(t, "KubeletReady", nodeCondition(node, corev1.NodeReady).Reason)
	})
}
