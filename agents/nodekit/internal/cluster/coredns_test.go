package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestCoreDNSObjectsAsKubeadm(t *testing.T) {
	sa, role, binding, cm, deploy, svc := CoreDNSObjects()
	assert.Equal(t, "coredns", sa.Name)
	assert.Equal(t, "system:coredns", role.Name)
	assert.Equal(t, "coredns", binding.Subjects[0].Name)
	assert.Contains(t, cm.Data["Corefile"], "forward . /etc/resolv.conf {")
	c := deploy.Spec.Template.Spec.Containers[0]
	assert.Equal(t, CoreDNSImage, c.Image)
	assert.Equal(t, []string{"-conf", "/etc/coredns/Corefile"}, c.Args)
	assert.Equal(t, int32(2), *deploy.Spec.Replicas)
	assert.Equal(t, "kube-dns", svc.Name)
	assert.Equal(t, "10.96.0.10", svc.Spec.ClusterIP)
	assert.Equal(t, ClusterDNS, svc.Spec.ClusterIP)

	// Deploying twice is harmless: what exists is left alone.
	client := fake.NewClientset()
	require.NoError(t, deployCoreDNS(context.Background(), client))
	require.NoError(t, deployCoreDNS(context.Background(), client))
	got, err := client.AppsV1().Deployments(metav1.NamespaceSystem).Get(context.Background(), "coredns", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, CoreDNSImage, got.Spec.Template.Spec.Containers[0].Image)
}
