package staticpod

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate checks a defaulted static pod the way the kubelet does before running it:
// first a create-time validation of the pod, then the rule that static pods may not
// reference API objects. The kubelet calls the API server's full ValidatePodCreate,
// which lives in k8s.io/kubernetes and cannot be imported here; Validate implements
// the checks that decide whether a static pod can run and get a mirror pod:
//
//   - metadata: name (a DNS-1123 subdomain after the node suffix), namespace (a
//     DNS-1123 label), labels, annotations, owner references;
//   - spec.nodeName a DNS-1123 subdomain: a node name with capitals makes every
//     static pod invalid, in the kubelet too;
//   - spec: at least one container; container names unique DNS-1123 labels across
//     init and app containers; image required; restartPolicy, dnsPolicy and
//     imagePullPolicy values; ports (range, protocol, unique names, hostPort equal to
//     containerPort under hostNetwork); volume names unique DNS-1123 labels with
//     exactly one source; hostPath paths; volumeMounts naming a volume, with unique
//     absolute-or-relative non-empty mount paths; env names; requests not above limits;
//     probes with one handler, positive timings and successThreshold 1 for liveness
//     and startup; terminationGracePeriodSeconds not negative.
//
// Not checked (the API server still refuses them when the mirror pod is posted, and
// the mirror reconciler reports that): security context details, affinity and
// topology spread syntax, resource claims beyond the API reference rule,
// feature-gated fields, quantities of extended resources.
//
// The error matches ErrInvalidPod (validation) or ErrAPIReference.
func Validate(pod *corev1.Pod) error {
	if errs := validatePod(pod); len(errs) > 0 {
		return &ManifestError{Kind: ErrInvalidPod, Detail: "invalid pod: " + errs.ToAggregate().Error()}
	}
	resource, err := apiObjectReference(pod)
	if err != nil {
		return &ManifestError{Kind: ErrInvalidPod, Detail: "invalid pod: " + err.Error()}
	}
	if resource != "" {
		return &ManifestError{Kind: ErrAPIReference, Detail: "static pods may not reference " + resource}
	}
	return nil
}

func validatePod(pod *corev1.Pod) field.ErrorList {
	errs := apivalidation.ValidateObjectMeta(&pod.ObjectMeta, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	spec := &pod.Spec
	sp := field.NewPath("spec")

	if spec.NodeName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(spec.NodeName) {
			errs = append(errs, field.Invalid(sp.Child("nodeName"), spec.NodeName, msg))
		}
	}
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(sp.Child("containers"), ""))
	}
	names := sets.New[string]()
	volumes := sets.New[string]()
	for i, v := range spec.Volumes {
		p := sp.Child("volumes").Index(i)
		errs = append(errs, validateDNSLabel(v.Name, p.Child("name"))...)
		if volumes.Has(v.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
		}
		volumes.Insert(v.Name)
		if n := countVolumeSources(&v.VolumeSource); n != 1 {
			if n == 0 {
				errs = append(errs, field.Required(p, "must specify a volume type"))
			} else {
				errs = append(errs, field.Forbidden(p, "may not specify more than 1 volume type"))
			}
		}
		if v.HostPath != nil && v.HostPath.Path == "" {
			errs = append(errs, field.Required(p.Child("hostPath", "path"), ""))
		}
	}
	type group struct {
		path       *field.Path
		containers []corev1.Container
		init       bool
	}
	for _, g := range []group{{sp.Child("initContainers"), spec.InitContainers, true}, {sp.Child("containers"), spec.Containers, false}} {
		for i := range g.containers {
			errs = append(errs, validateContainer(&g.containers[i], g.path.Index(i), spec, names, volumes, g.init)...)
		}
	}

	switch spec.RestartPolicy {
	case corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		errs = append(errs, field.NotSupported(sp.Child("restartPolicy"), spec.RestartPolicy,
			[]corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever}))
	}
	switch spec.DNSPolicy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet, corev1.DNSDefault, corev1.DNSNone:
	default:
		errs = append(errs, field.NotSupported(sp.Child("dnsPolicy"), spec.DNSPolicy,
			[]corev1.DNSPolicy{corev1.DNSClusterFirstWithHostNet, corev1.DNSClusterFirst, corev1.DNSDefault, corev1.DNSNone}))
	}
	if spec.DNSPolicy == corev1.DNSNone && (spec.DNSConfig == nil || len(spec.DNSConfig.Nameservers) == 0) {
		errs = append(errs, field.Required(sp.Child("dnsConfig", "nameservers"), "must provide at least one DNS nameserver when dnsPolicy is None"))
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(sp.Child("terminationGracePeriodSeconds"), *g, "must be >= 0"))
	}
	if d := spec.ActiveDeadlineSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(sp.Child("activeDeadlineSeconds"), *d, "must be between 1 and 2147483647, inclusive"))
	}
	if spec.PriorityClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(spec.PriorityClassName) {
			errs = append(errs, field.Invalid(sp.Child("priorityClassName"), spec.PriorityClassName, msg))
		}
	}
	if len(spec.EphemeralContainers) > 0 {
		errs = append(errs, field.Forbidden(sp.Child("ephemeralContainers"), "cannot be set on create"))
	}
	return errs
}

func validateContainer(c *corev1.Container, p *field.Path, spec *corev1.PodSpec, names, volumes sets.Set[string], init bool) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateDNSLabel(c.Name, p.Child("name"))...)
	if names.Has(c.Name) {
		errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
	}
	names.Insert(c.Name)
	if strings.TrimSpace(c.Image) == "" {
		errs = append(errs, field.Required(p.Child("image"), ""))
	} else if c.Image != strings.TrimSpace(c.Image) {
		errs = append(errs, field.Invalid(p.Child("image"), c.Image, "must not have leading or trailing whitespace"))
	}
	switch c.ImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), c.ImagePullPolicy,
			[]corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}))
	}
	switch c.TerminationMessagePolicy {
	case corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError:
	default:
		errs = append(errs, field.NotSupported(p.Child("terminationMessagePolicy"), c.TerminationMessagePolicy,
			[]corev1.TerminationMessagePolicy{corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError}))
	}

	portNames := sets.New[string]()
	for i, port := range c.Ports {
		pp := p.Child("ports").Index(i)
		if port.Name != "" {
			for _, msg := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
			}
			if portNames.Has(port.Name) {
				errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
			}
			portNames.Insert(port.Name)
		}
		for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
			errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
		}
		if port.HostPort != 0 {
			for _, msg := range validation.IsValidPortNum(int(port.HostPort)) {
				errs = append(errs, field.Invalid(pp.Child("hostPort"), port.HostPort, msg))
			}
		}
		if spec.HostNetwork && port.HostPort != port.ContainerPort {
			errs = append(errs, field.Invalid(pp.Child("hostPort"), port.HostPort, "must match `containerPort` when `hostNetwork` is true"))
		}
		switch port.Protocol {
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			errs = append(errs, field.NotSupported(pp.Child("protocol"), port.Protocol,
				[]corev1.Protocol{corev1.ProtocolSCTP, corev1.ProtocolTCP, corev1.ProtocolUDP}))
		}
	}

	for i, env := range c.Env {
		ep := p.Child("env").Index(i)
		if env.Name == "" {
			errs = append(errs, field.Required(ep.Child("name"), ""))
		} else if strings.Contains(env.Name, "=") {
			errs = append(errs, field.Invalid(ep.Child("name"), env.Name, "must not contain '='"))
		}
	}

	mountPaths := sets.New[string]()
	for i, m := range c.VolumeMounts {
		mp := p.Child("volumeMounts").Index(i)
		if m.Name == "" {
			errs = append(errs, field.Required(mp.Child("name"), ""))
		} else if !volumes.Has(m.Name) {
			errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
		}
		if m.MountPath == "" {
			errs = append(errs, field.Required(mp.Child("mountPath"), ""))
		} else if mountPaths.Has(m.MountPath) {
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, "must be unique"))
		}
		mountPaths.Insert(m.MountPath)
	}

	for name, limit := range c.Resources.Limits {
		if req, ok := c.Resources.Requests[name]; ok && req.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(p.Child("resources", "requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, limit.String())))
		}
	}

	probes := []struct {
		name  string
		probe *corev1.Probe
		oneOK bool // successThreshold must be 1
	}{{"livenessProbe", c.LivenessProbe, true}, {"readinessProbe", c.ReadinessProbe, false}, {"startupProbe", c.StartupProbe, true}}
	for _, pr := range probes {
		if pr.probe == nil {
			continue
		}
		pp := p.Child(pr.name)
		if init && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
			errs = append(errs, field.Forbidden(pp, "may not be set for init containers without restartPolicy=Always"))
			continue
		}
		errs = append(errs, validateProbe(pr.probe, pp, pr.oneOK)...)
	}
	return errs
}

func validateProbe(pr *corev1.Probe, p *field.Path, successMustBeOne bool) field.ErrorList {
	var errs field.ErrorList
	handlers := 0
	if pr.Exec != nil {
		handlers++
	}
	if pr.HTTPGet != nil {
		handlers++
		for _, msg := range validatePortRef(pr.HTTPGet.Port.String(), pr.HTTPGet.Port.IntValue(), pr.HTTPGet.Port.Type == 0) {
			errs = append(errs, field.Invalid(p.Child("httpGet", "port"), pr.HTTPGet.Port.String(), msg))
		}
		switch pr.HTTPGet.Scheme {
		case corev1.URISchemeHTTP, corev1.URISchemeHTTPS:
		default:
			errs = append(errs, field.NotSupported(p.Child("httpGet", "scheme"), pr.HTTPGet.Scheme, []corev1.URIScheme{corev1.URISchemeHTTP, corev1.URISchemeHTTPS}))
		}
	}
	if pr.TCPSocket != nil {
		handlers++
		for _, msg := range validatePortRef(pr.TCPSocket.Port.String(), pr.TCPSocket.Port.IntValue(), pr.TCPSocket.Port.Type == 0) {
			errs = append(errs, field.Invalid(p.Child("tcpSocket", "port"), pr.TCPSocket.Port.String(), msg))
		}
	}
	if pr.GRPC != nil {
		handlers++
		for _, msg := range validation.IsValidPortNum(int(pr.GRPC.Port)) {
			errs = append(errs, field.Invalid(p.Child("grpc", "port"), pr.GRPC.Port, msg))
		}
	}
	switch {
	case handlers == 0:
		errs = append(errs, field.Required(p, "must specify a handler type"))
	case handlers > 1:
		errs = append(errs, field.Forbidden(p, "may not specify more than 1 handler type"))
	}
	for name, v := range map[string]int32{"initialDelaySeconds": pr.InitialDelaySeconds, "timeoutSeconds": pr.TimeoutSeconds,
		"periodSeconds": pr.PeriodSeconds, "successThreshold": pr.SuccessThreshold, "failureThreshold": pr.FailureThreshold} {
		if v < 0 {
			errs = append(errs, field.Invalid(p.Child(name), v, "must be greater than or equal to 0"))
		}
	}
	if successMustBeOne && pr.SuccessThreshold != 1 {
		errs = append(errs, field.Invalid(p.Child("successThreshold"), pr.SuccessThreshold, "must be 1"))
	}
	return errs
}

func validatePortRef(text string, num int, isInt bool) []string {
	if isInt {
		return validation.IsValidPortNum(num)
	}
	return validation.IsValidPortName(text)
}

func validateDNSLabel(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

func countVolumeSources(s *corev1.VolumeSource) int {
	n := 0
	for _, set := range []bool{
		s.HostPath != nil, s.EmptyDir != nil, s.GCEPersistentDisk != nil, s.AWSElasticBlockStore != nil,
		s.GitRepo != nil, s.Secret != nil, s.NFS != nil, s.ISCSI != nil, s.Glusterfs != nil,
		s.PersistentVolumeClaim != nil, s.RBD != nil, s.FlexVolume != nil, s.Cinder != nil, s.CephFS != nil,
		s.Flocker != nil, s.DownwardAPI != nil, s.FC != nil, s.AzureFile != nil, s.ConfigMap != nil,
		s.VsphereVolume != nil, s.Quobyte != nil, s.AzureDisk != nil, s.PhotonPersistentDisk != nil,
		s.Projected != nil, s.PortworxVolume != nil, s.ScaleIO != nil, s.StorageOS != nil, s.CSI != nil,
		s.Ephemeral != nil, s.Image != nil,
	} {
		if set {
			n++
		}
	}
	return n
}

// apiObjectReference reports the kind of API object a pod references, in the
// kubelet's order and words ("serviceaccounts", "secrets", "configmaps (via projected
// volumes)", ...), or "" when it references none.
func apiObjectReference(pod *corev1.Pod) (string, error) {
	spec := &pod.Spec
	if spec.ServiceAccountName != "" {
		return "serviceaccounts", nil
	}
	if referencesSecrets(spec) {
		return "secrets", nil
	}
	if referencesConfigMaps(spec) {
		return "configmaps", nil
	}
	if len(spec.ResourceClaims) > 0 {
		return "resourceclaims", nil
	}
	for _, v := range spec.Volumes {
		switch {
		case v.AWSElasticBlockStore != nil, v.AzureDisk != nil, v.CephFS != nil, v.Cinder != nil,
			v.DownwardAPI != nil, v.EmptyDir != nil, v.FC != nil, v.FlexVolume != nil, v.Flocker != nil,
			v.GCEPersistentDisk != nil, v.GitRepo != nil, v.HostPath != nil, v.Image != nil, v.ISCSI != nil,
			v.NFS != nil, v.PhotonPersistentDisk != nil, v.PortworxVolume != nil, v.Quobyte != nil,
			v.RBD != nil, v.ScaleIO != nil, v.StorageOS != nil, v.VsphereVolume != nil:
		case v.ConfigMap != nil:
			return "configmaps (via configmap volumes)", nil
		case v.Secret != nil:
			return "secrets (via secret volumes)", nil
		case v.CSI != nil:
			return "csidrivers (via CSI volumes)", nil
		case v.Glusterfs != nil:
			return "endpoints (via glusterFS volumes)", nil
		case v.PersistentVolumeClaim != nil:
			return "persistentvolumeclaims", nil
		case v.Ephemeral != nil:
			return "persistentvolumeclaims (via ephemeral volumes)", nil
		case v.AzureFile != nil:
			return "secrets (via azureFile volumes)", nil
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				switch {
				case s.ConfigMap != nil:
					return "configmaps (via projected volumes)", nil
				case s.Secret != nil:
					return "secrets (via projected volumes)", nil
				case s.ServiceAccountToken != nil:
					return "serviceaccounts (via projected volumes)", nil
				case s.ClusterTrustBundle != nil:
					return "clustertrustbundles", nil
				case s.PodCertificate != nil:
					return "podcertificates", nil
				case s.DownwardAPI != nil:
				default:
					return "", fmt.Errorf("unknown source for projected volume %q", v.Name)
				}
			}
		default:
			return "", fmt.Errorf("unknown volume type for volume %q", v.Name)
		}
	}
	return "", nil
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	for i := range spec.EphemeralContainers {
		c := corev1.Container(spec.EphemeralContainers[i].EphemeralContainerCommon)
		out = append(out, &c)
	}
	return out
}

func referencesSecrets(spec *corev1.PodSpec) bool {
	if len(spec.ImagePullSecrets) > 0 {
		return true
	}
	for _, c := range allContainers(spec) {
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				return true
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return true
			}
		}
	}
	for _, v := range spec.Volumes {
		s := &v.VolumeSource
		switch {
		case s.AzureFile != nil:
			if s.AzureFile.SecretName != "" {
				return true
			}
		case s.CephFS != nil:
			if s.CephFS.SecretRef != nil {
				return true
			}
		case s.Cinder != nil:
			if s.Cinder.SecretRef != nil {
				return true
			}
		case s.FlexVolume != nil:
			if s.FlexVolume.SecretRef != nil {
				return true
			}
		case s.Projected != nil:
			for _, src := range s.Projected.Sources {
				if src.Secret != nil {
					return true
				}
			}
		case s.RBD != nil:
			if s.RBD.SecretRef != nil {
				return true
			}
		case s.Secret != nil:
			return true
		case s.ScaleIO != nil:
			if s.ScaleIO.SecretRef != nil {
				return true
			}
		case s.ISCSI != nil:
			if s.ISCSI.SecretRef != nil {
				return true
			}
		case s.StorageOS != nil:
			if s.StorageOS.SecretRef != nil {
				return true
			}
		case s.CSI != nil:
			if s.CSI.NodePublishSecretRef != nil {
				return true
			}
		}
	}
	return false
}

func referencesConfigMaps(spec *corev1.PodSpec) bool {
	for _, c := range allContainers(spec) {
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				return true
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				return true
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			return true
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ConfigMap != nil {
					return true
				}
			}
		}
	}
	return false
}
