package certs_test

import (
	"context"
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

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/certs"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestBootstrapWithoutRotation is the one-shot bootstrap (rotateCertificates off)
// against a real control plane: a bootstrap token, kubeadm's RBAC for it, and
// kube-controller-manager's approving and signing controllers.
func TestBootstrapWithoutRotation(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, Controllers: []string{
		"certificatesigningrequest-approving-controller", "certificatesigningrequest-signing-controller",
	}})
	admin := cp.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const group = "system:bootstrappers:kubeadm:default-node-token"
	_, err := admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-07401b", Namespace: "kube-system"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": "07401b", "token-secret": "f395accd246ae52d",
			"usage-bootstrap-authentication": "true", "auth-extra-groups": group,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for name, role := range map[string]string{
		"kubeadm:kubelet-bootstrap":          "system:node-bootstrapper",
		"kubeadm:node-autoapprove-bootstrap": "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
	} {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: group}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "bootstrap-kubelet.conf")
	bk := clientcmdapi.NewConfig()
	bk.Clusters["k"] = &clientcmdapi.Cluster{Server: cp.URL(), CertificateAuthority: filepath.Join(cp.Dir(), "apiserver-certs", "apiserver.crt")}
	bk.AuthInfos["t"] = &clientcmdapi.AuthInfo{Token: "07401b.f395accd246ae52d"}
	bk.Contexts["c"] = &clientcmdapi.Context{Cluster: "k", AuthInfo: "t"}
	bk.CurrentContext = "c"
	require.NoError(t, clientcmd.WriteToFile(*bk, bootstrap))
	cfg := certs.Config{NodeName: "boot-a", Kubeconfig: filepath.Join(dir, "kubelet.conf"), BootstrapKubeconfig: bootstrap, CertDir: filepath.Join(dir, "pki")}

	begin := time.Now()
	c, err := certs.NewClient(ctx, cfg)
	require.NoError(t, err)
	t.Logf("bootstrapped in %s", time.Since(begin).Round(time.Millisecond))

	l, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, l.Items, 1)
	csr := l.Items[0]
	assert.True(t, strings.HasPrefix(csr.Name, "node-csr-"), "CSR name %s", csr.Name)
	assert.Equal(t, certificatesv1.KubeAPIServerClientKubeletSignerName, csr.Spec.SignerName)
	assert.Equal(t, "system:bootstrap:07401b", csr.Spec.Username)
	require.NotEmpty(t, csr.Status.Conditions)
	assert.Equal(t, "AutoApproved", csr.Status.Conditions[0].Reason)

	_, err = os.Stat(filepath.Join(cfg.CertDir, "kubelet-client.key.tmp"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary key is removed once the certificate is stored")

	// The client is the node, as the Node authorizer and NodeRestriction see it.
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "system:node:boot-a", ssr.Status.UserInfo.Username)
	assert.Contains(t, ssr.Status.UserInfo.Groups, "system:nodes")

	// Started again, the valid kubeconfig is used: no second CSR.
	_, err = certs.NewClient(ctx, cfg)
	require.NoError(t, err)
	l, err = admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, l.Items, 1)
}
