package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJoinFlagsAndConfig(t *testing.T) {
	var o options
	require.NoError(t, newFlagSet(&o).Parse([]string{
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--kubeconfig=/etc/kubernetes/kubelet.conf", "--root-dir=/var/lib/k",
	}))
	assert.Equal(t, "/etc/kubernetes/bootstrap-kubelet.conf", o.bootstrapKubeconfig)
	assert.Equal(t, "/var/lib/kubelet/pki", certDir(&o), "--cert-dir defaults to upstream's /var/lib/kubelet/pki, whatever --root-dir says")
	require.NoError(t, newFlagSet(&o).Parse([]string{"--cert-dir=/srv/pki"}))
	assert.Equal(t, "/srv/pki", certDir(&o))

	cfg, ignored, err := loadConfig(writeConfig(t, header+"rotateCertificates: true\nserverTLSBootstrap: true\n"))
	require.NoError(t, err)
	assert.Empty(t, ignored, "rotateCertificates and serverTLSBootstrap are honoured")
	assert.True(t, cfg.RotateCertificates)
	assert.True(t, cfg.ServerTLSBootstrap)

	_, err = buildConfig(&options{bootstrapKubeconfig: "/etc/kubernetes/bootstrap-kubelet.conf"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "--bootstrap-kubeconfig /etc/kubernetes/bootstrap-kubelet.conf needs --kubeconfig")
}
