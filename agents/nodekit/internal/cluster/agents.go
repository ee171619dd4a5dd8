package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// ClusterDNS is the kube-dns Service address kubeadm uses (the tenth of ServiceCIDR).
const ClusterDNS = "10.96.0.10"

// FabricAdminKubeconfig is an admin kubeconfig that reaches the API server at its
// fabric address, for tools run inside a node's namespace (nodekit explain).
const FabricAdminKubeconfig = "admin-fabric.kubeconfig"

// agents starts each node's kubelet and kube-proxy (those whose binaries are given),
// each inside the node's namespace with its own identity, then waits until every node
// is Ready.
func (c *Cluster) agents(ctx context.Context) error {
	for i := range c.st.Nodes {
		n := &c.st.Nodes[i]
		if c.cfg.KubeletBinary != "" {
			// The identity the Node authorizer and NodeRestriction judge a kubelet by.
			if err := c.ca.writeKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), c.cfg.Name, c.agentServer(), "system:node:"+n.Name, "system:nodes"); err != nil {
				return err
			}
			// Recorded before it is made, so a failed up's down removes it too.
			n.CgroupRoot = cgroupRootFor(c.cfg.Name, n.Name)
			if err := c.st.save(); err != nil {
				return err
			}
			if err := makeCgroupRoot(n.CgroupRoot); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(n.Dir, "kubelet.yaml"), []byte(c.kubeletConfig(n)), 0o644); err != nil {
				return err
			}
			if err := c.start(c.kubeletLaunch(n)); err != nil {
				return err
			}
		}
		if c.cfg.KubeProxyBinary != "" {
			// system:kube-proxy is the user the bootstrap policy binds to system:node-proxier.
			if err := c.ca.writeKubeconfig(filepath.Join(n.Dir, "kube-proxy.kubeconfig"), c.cfg.Name, c.agentServer(), "system:kube-proxy"); err != nil {
				return err
			}
			if err := c.start(c.kubeProxyLaunch(n)); err != nil {
				return err
			}
		}
	}
	if err := c.st.save(); err != nil {
		return err
	}
	if c.cfg.KubeletBinary == "" {
		return nil
	}
	cfg, err := c.adminREST()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	begin := time.Now()
	for _, n := range c.st.Nodes {
		if err := c.waitNodeReady(ctx, client, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	c.logf("%d node(s) Ready (%s after the agents started)", len(c.st.Nodes), time.Since(begin).Round(time.Millisecond))
	return nil
}

// agentServer is the API server URL in the kubelets' and kube-proxies' kubeconfigs:
// its advertised address, as on a kubeadm node.
func (c *Cluster) agentServer() string {
	ip, port := c.apiEndpoint()
	return "https://" + net.JoinHostPort(ip, strconv.Itoa(port))
}

// kubeletConfig is the node's KubeletConfiguration. The kubelet's port as kubeadm
// configures it: client certificates from the cluster CA (kube-apiserver's among
// them), tokens checked by TokenReview, every request authorized by
// SubjectAccessReview.
//
// Image garbage collection is off and the disk eviction thresholds are 0%, as kind
// configures its nodes: a test cluster's images are imported, not pulled (the mirror
// serves only the OCI tars it was given), and the nodes share the machine's disk, whose
// fill level says nothing about the cluster. memory.available keeps the kubelet's
// default; it is written out because a partial evictionHard map replaces the defaults.
//
// Each node keeps its pods' logs in its own folder, not the default /var/log/pods: a
// kubelet owns its podLogsDir, and its garbage collector removes the folders of pods
// that are not its own, which on a shared folder are the other nodes' pods.
func (c *Cluster) kubeletConfig(n *Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: %q
cgroupDriver: cgroupfs
cgroupRoot: %q
podLogsDir: %q
clusterDomain: cluster.local
clusterDNS:
- %s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
`, n.Runtime, n.CgroupRoot, filepath.Join(n.Dir, "pod-logs"), ClusterDNS, c.path("pki", "ca.crt"))
}

func (c *Cluster) kubeletLaunch(n *Node) launch {
	return launch{Name: "kubelet", Node: n.Name, NetNS: n.NetNS, Bin: c.cfg.KubeletBinary, Args: []string{
		"--config=" + filepath.Join(n.Dir, "kubelet.yaml"), "--kubeconfig=" + filepath.Join(n.Dir, "kubelet.kubeconfig"),
		"--hostname-override=" + n.Name, "--node-ip=" + n.IP,
		"--root-dir=" + filepath.Join(n.Dir, "kubelet"), "--cert-dir=" + filepath.Join(n.Dir, "kubelet", "pki"), "--container-runtime-endpoint=" + n.Runtime,
	}}
}

func (c *Cluster) kubeProxyLaunch(n *Node) launch {
	return launch{Name: "kube-proxy", Node: n.Name, NetNS: n.NetNS, Bin: c.cfg.KubeProxyBinary, Args: []string{
		"--kubeconfig=" + filepath.Join(n.Dir, "kube-proxy.kubeconfig"), "--hostname-override=" + n.Name, "--proxy-mode=nftables",
		"--cluster-cidr=" + ClusterCIDR, "--healthz-bind-address=0.0.0.0:10256", "--metrics-bind-address=127.0.0.1:10249",
	}}
}

// waitNodeReady sets the node's podCIDR once it registers (what the node IPAM
// controller does on a real cluster; here the CIDR is fixed by the node's CNI config)
// and waits for Ready=True.
func (c *Cluster) waitNodeReady(ctx context.Context, client kubernetes.Interface, n Node) error {
	kubelet := c.process("kubelet", n.Name)
	cidrSet := false
	return poll(ctx, 2*time.Minute, 100*time.Millisecond, func(ctx context.Context) error {
		if !kubelet.Alive() {
			return fmt.Errorf("%w: the kubelet exited (see %s)", errGiveUp, kubelet.Log)
		}
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("not registered yet")
		}
		if err != nil {
			return err
		}
		if !cidrSet && node.Spec.PodCIDR == "" {
			patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.PodCIDR, n.PodCIDR)
			if _, err := client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("set podCIDR: %w", err)
			}
			cidrSet = true
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("condition Ready=%s %s: %s", cond.Status, cond.Reason, cond.Message)
			}
		}
		return fmt.Errorf("no Ready condition yet")
	})
}
