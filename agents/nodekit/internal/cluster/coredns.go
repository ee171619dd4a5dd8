package cluster

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// CoreDNSImage is the image kubeadm v1.37.2 deploys; hack/build-coredns.sh builds it
// locally under this name.
const CoreDNSImage = "registry.k8s.io/coredns/coredns:v1.14.6"

// corefile is kubeadm's Corefile for the cluster.local domain.
const corefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`

// CoreDNSObjects are the objects kubeadm's CoreDNS add-on creates, with kubeadm's
// names, labels, Corefile, probes, resources and security context: the coredns
// ServiceAccount, the system:coredns ClusterRole and binding, the coredns ConfigMap and
// Deployment (2 replicas) and the kube-dns Service at ClusterDNS.
func CoreDNSObjects() (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.ConfigMap, *appsv1.Deployment, *corev1.Service) {
	ns := metav1.NamespaceSystem
	labels := map[string]string{"k8s-app": "kube-dns"}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns}}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "coredns", Namespace: ns}},
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns}, Data: map[string]string{"Corefile": corefile}}
	probe := func(path, port string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(port), Scheme: corev1.URISchemeHTTP}}}
	}
	liveness := probe("/health", "liveness-probe")
	liveness.InitialDelaySeconds, liveness.TimeoutSeconds, liveness.SuccessThreshold, liveness.FailureThreshold = 60, 5, 1, 5
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))}},
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					PriorityClassName:  "system-cluster-critical",
					ServiceAccountName: "coredns",
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
						Weight: 100,
						PodAffinityTerm: corev1.PodAffinityTerm{
							LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k8s-app", Operator: metav1.LabelSelectorOpIn, Values: []string{"kube-dns"}}}},
							TopologyKey:   corev1.LabelHostname,
						},
					}}}},
					Tolerations: []corev1.Toleration{
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
					},
					NodeSelector: map[string]string{corev1.LabelOSStable: "linux"},
					Containers: []corev1.Container{{
						Name:            "coredns",
						Image:           CoreDNSImage,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Resources: corev1.ResourceRequirements{
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
						},
						Args:         []string{"-conf", "/etc/coredns/Corefile"},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						Ports: []corev1.ContainerPort{
							{ContainerPort: 53, Name: "dns", Protocol: corev1.ProtocolUDP},
							{ContainerPort: 53, Name: "dns-tcp", Protocol: corev1.ProtocolTCP},
							{ContainerPort: 9153, Name: "metrics", Protocol: corev1.ProtocolTCP},
							{ContainerPort: 8080, Name: "liveness-probe", Protocol: corev1.ProtocolTCP},
							{ContainerPort: 8181, Name: "readiness-probe", Protocol: corev1.ProtocolTCP},
						},
						LivenessProbe:  liveness,
						ReadinessProbe: probe("/ready", "readiness-probe"),
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}},
							ReadOnlyRootFilesystem:   ptr.To(true),
						},
					}},
					DNSPolicy: corev1.DNSDefault,
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"},
						Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
					}}}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "kube-dns", Namespace: ns,
			Labels:      map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
			Annotations: map[string]string{"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: ClusterDNS,
			Selector:  labels,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
				{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
			},
		},
	}
	return sa, role, binding, cm, deploy, svc
}

// deployCoreDNS creates the add-on's objects; ones that exist are left as they are.
func deployCoreDNS(ctx context.Context, client kubernetes.Interface) error {
	sa, role, binding, cm, deploy, svc := CoreDNSObjects()
	ns := metav1.NamespaceSystem
	steps := []struct {
		what   string
		create func() error
	}{
		{"ServiceAccount coredns", func() error {
			_, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
			return err
		}},
		{"ClusterRole system:coredns", func() error {
			_, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		}},
		{"ClusterRoleBinding system:coredns", func() error {
			_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		}},
		{"ConfigMap coredns", func() error {
			_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			return err
		}},
		{"Deployment coredns", func() error {
			_, err := client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{})
			return err
		}},
		{"Service kube-dns", func() error {
			_, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},
	}
	var errs []error
	for _, s := range steps {
		if err := s.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("CoreDNS add-on: create %s: %w", s.what, err))
		}
	}
	return errors.Join(errs...)
}
