package explain

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/rules"
)

// checkTimeout bounds every single check, so one hung endpoint cannot stall explain.
const checkTimeout = 3 * time.Second

// NodeOptions say where to look. Empty local fields skip that check: explain run away
// from the node reads the API only.
type NodeOptions struct {
	Client kubernetes.Interface
	// GracePeriod is the cluster's node-monitor-grace-period; zero means 50s.
	GracePeriod time.Duration
	// KubeletHealthzURL is the kubelet's healthz (upstream: http://127.0.0.1:10248/healthz).
	KubeletHealthzURL string
	// RuntimeEndpoint is the CRI socket (unix:///run/containerd/containerd.sock).
	RuntimeEndpoint string
	// CNIConfDir is the CNI configuration folder (/etc/cni/net.d).
	CNIConfDir string
}

// GatherNode collects the evidence about node name. API failures other than NotFound
// become Problems rather than errors, so explain still says what it can.
func GatherNode(ctx context.Context, name string, opts NodeOptions) NodeEvidence {
	ev := NodeEvidence{Name: name, GracePeriod: opts.GracePeriod}
	node, err := opts.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		ev.Problems = append(ev.Problems, err.Error())
		return ev
	case err != nil:
		ev.Problems = append(ev.Problems, "reading the Node: "+err.Error())
		return ev
	}
	ev.Node = node
	lease, err := opts.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		ev.Lease = lease
	case !apierrors.IsNotFound(err):
		ev.Problems = append(ev.Problems, "reading the Lease: "+err.Error())
	}
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": name}.AsSelector().String()
	events, err := opts.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		ev.Problems = append(ev.Problems, "reading events: "+err.Error())
	} else {
		ev.Events = events.Items
	}
	if opts.KubeletHealthzURL != "" || opts.RuntimeEndpoint != "" || opts.CNIConfDir != "" {
		ev.Local = &NodeLocal{}
		if opts.KubeletHealthzURL != "" {
			ev.Local.Kubelet = getHealth(ctx, opts.KubeletHealthzURL)
		}
		if opts.RuntimeEndpoint != "" {
			ev.Local.Runtime = runtimeStatus(ctx, opts.RuntimeEndpoint)
		}
		if opts.CNIConfDir != "" {
			ev.Local.CNI = cniConfigs(opts.CNIConfDir)
		}
	}
	return ev
}

func getHealth(ctx context.Context, url string) *HTTPCheck {
	c := &HTTPCheck{URL: url}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.Err = rootCause(err)
		return c
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	c.Status, c.Body = resp.StatusCode, string(body)
	return c
}

// rootCause keeps the end of a wrapped network error ("connection refused") rather
// than the whole chain, which repeats the URL.
func rootCause(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && i+2 < len(s) {
		return s[i+2:]
	}
	return s
}

func runtimeStatus(ctx context.Context, endpoint string) *RuntimeCheck {
	r := &RuntimeCheck{Endpoint: endpoint}
	target := endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		r.Err = rootCause(err)
		return r
	}
	for _, c := range resp.GetStatus().GetConditions() {
		switch c.GetType() {
		case runtimeapi.RuntimeReady:
			r.RuntimeReady, r.RuntimeReason, r.RuntimeMessage = c.GetStatus(), c.GetReason(), c.GetMessage()
		case runtimeapi.NetworkReady:
			r.NetworkReady, r.NetworkReason, r.NetworkMessage = c.GetStatus(), c.GetReason(), c.GetMessage()
		}
	}
	return r
}

// cniConfigs lists the files libcni would consider (.conf, .conflist, .json).
func cniConfigs(dir string) *CNICheck {
	c := &CNICheck{Dir: dir}
	entries, err := os.ReadDir(dir)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && (strings.HasSuffix(n, ".conf") || strings.HasSuffix(n, ".conflist") || strings.HasSuffix(n, ".json")) {
			c.Files = append(c.Files, n)
		}
	}
	sort.Strings(c.Files)
	return c
}

// RulesReader is the part of a rules writer explain uses; *rules.NFTables and
// *rules.IPTables satisfy it.
type RulesReader interface {
	ReadBack(ctx context.Context) ([]rules.KernelService, error)
	Drift(ctx context.Context, st *rules.State) ([]rules.Drift, error)
}

// RulesTracer follows a packet through the kernel's Service rules; *rules.NFTables and
// *rules.IPTables satisfy it.
type RulesTracer interface {
	Trace(ctx context.Context, p rules.Packet) (*rules.TraceResult, error)
}

// ServiceOptions say where to look; nil or empty local fields skip that check.
type ServiceOptions struct {
	// TraceFrom, when valid and Rules is a RulesTracer, traces a new connection from
	// this client address to each of the Service's ports.
	TraceFrom netip.Addr
	Client    kubernetes.Interface
	// KubeProxyHealthzURL is kube-proxy's healthz (upstream: http://127.0.0.1:10256/healthz).
	KubeProxyHealthzURL string
	// Rules reads the kernel's Service rules on this node; RulesBackend names it.
	Rules        RulesReader
	RulesBackend string
}

// GatherService collects the evidence about the Service ns/name.
func GatherService(ctx context.Context, ns, name string, opts ServiceOptions) ServiceEvidence {
	ev := ServiceEvidence{Namespace: ns, Name: name}
	svc, err := opts.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		ev.Problems = append(ev.Problems, err.Error())
		return ev
	case err != nil:
		ev.Problems = append(ev.Problems, "reading the Service: "+err.Error())
		return ev
	}
	ev.Service = svc
	slices, err := opts.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		ev.Problems = append(ev.Problems, "reading EndpointSlices: "+err.Error())
	} else {
		ev.Slices = slices.Items
	}
	if opts.KubeProxyHealthzURL != "" {
		ev.KubeProxy = proxyHealth(ctx, opts.KubeProxyHealthzURL)
	}
	if opts.Rules != nil && svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone {
		ev.Rules = readRules(ctx, opts.Rules, opts.RulesBackend, svc, ev.Slices)
		if tr, ok := opts.Rules.(RulesTracer); ok && opts.TraceFrom.IsValid() && ev.Rules.Err == "" {
			ev.Rules.Traces = traces(ctx, tr, opts.TraceFrom, svc)
		}
	}
	return ev
}

// traces follows a new connection from client to each port of svc's cluster IP.
func traces(ctx context.Context, tr RulesTracer, client netip.Addr, svc *corev1.Service) []string {
	dst, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return nil
	}
	var out []string
	for _, sp := range svc.Spec.Ports {
		r, err := tr.Trace(ctx, rules.Packet{Src: client, Dst: dst, Protocol: rules.Protocol(sp.Protocol), Port: int(sp.Port)})
		head := fmt.Sprintf("trace %s -> %s:%d/%s", client, dst, sp.Port, sp.Protocol)
		if err != nil {
			out = append(out, head+": "+err.Error())
			continue
		}
		line := head + ": " + r.Verdict
		if len(r.Candidates) > 0 {
			var c []string
			for _, e := range r.Candidates {
				c = append(c, e.String())
			}
			line += " to one of " + strings.Join(c, ", ")
		}
		if r.Masquerade {
			line += " (masqueraded)"
		}
		line += " via " + strings.Join(r.Path, " > ")
		out = append(out, line)
	}
	return out
}

func proxyHealth(ctx context.Context, url string) *ProxyHealth {
	c := getHealth(ctx, url)
	p := &ProxyHealth{URL: url, Err: c.Err, Status: c.Status}
	var body struct {
		LastUpdated string `json:"lastUpdated"`
	}
	if c.Err == "" && json.Unmarshal([]byte(c.Body), &body) == nil {
		p.LastUpdated = parseGoTime(body.LastUpdated)
	}
	return p
}

// parseGoTime reads a time printed with time.Time.String, as upstream kube-proxy's
// /healthz prints it ("2026-12-03 06:00:00.123 +0000 UTC m=+12.5"), or in RFC 3339;
// zero when unreadable.
func parseGoTime(s string) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	if i := strings.Index(s, " m="); i >= 0 {
		s = s[:i]
	}
	t, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", s)
	if err != nil {
		return time.Time{}
	}
	return t
}

func readRules(ctx context.Context, r RulesReader, backend string, svc *corev1.Service, slices []discoveryv1.EndpointSlice) *RulesCheck {
	rc := &RulesCheck{Backend: backend}
	ctx, cancel := context.WithTimeout(ctx, 2*checkTimeout)
	defer cancel()
	kernel, err := r.ReadBack(ctx)
	if err != nil {
		rc.Err = err.Error()
		return rc
	}
	for _, k := range kernel {
		if strings.HasPrefix(k.Dest, svc.Spec.ClusterIP+" . ") {
			rc.Kernel = append(rc.Kernel, k)
		}
	}
	st, err := DesiredState(svc, slices)
	if err != nil {
		rc.Err = err.Error()
		return rc
	}
	drift, err := r.Drift(ctx, st)
	if err != nil {
		rc.Err = err.Error()
		return rc
	}
	prefix := svc.Namespace + "/" + svc.Name
	for _, d := range drift {
		// Drift against a state holding only this Service reports every other Service
		// as unexpected; keep what concerns this one.
		if d.Service == prefix || strings.HasPrefix(d.Service, prefix+":") {
			rc.Drift = append(rc.Drift, d)
		}
	}
	return rc
}

// DesiredState is the rules state kube-proxy would write for svc's ports from its
// EndpointSlices: ready endpoints, or, when none is ready, the serving and terminating
// ones (kube-proxy's fallback).
func DesiredState(svc *corev1.Service, slices []discoveryv1.EndpointSlice) (*rules.State, error) {
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !ip.Is4() {
		return nil, fmt.Errorf("service %s/%s: cluster IP %q is not an IPv4 address", svc.Namespace, svc.Name, svc.Spec.ClusterIP)
	}
	st := &rules.State{}
	for _, sp := range svc.Spec.Ports {
		var ready, fallback []rules.Endpoint
		for _, s := range slices {
			if s.AddressType != discoveryv1.AddressTypeIPv4 {
				continue
			}
			port := slicePort(s, sp)
			if port == 0 {
				continue
			}
			for _, e := range s.Endpoints {
				isReady := e.Conditions.Ready == nil || *e.Conditions.Ready
				serving := isReady
				if e.Conditions.Serving != nil {
					serving = *e.Conditions.Serving
				}
				terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
				for _, a := range e.Addresses {
					addr, err := netip.ParseAddr(a)
					if err != nil {
						continue
					}
					ep := rules.Endpoint{IP: addr, Port: port}
					switch {
					case isReady:
						ready = append(ready, ep)
					case serving && terminating:
						fallback = append(fallback, ep)
					}
				}
			}
		}
		if len(ready) == 0 {
			ready = fallback
		}
		st.Services = append(st.Services, rules.Service{
			Namespace: svc.Namespace, Name: svc.Name, PortName: sp.Name,
			Protocol: rules.Protocol(sp.Protocol), ClusterIP: ip, Port: int(sp.Port), NodePort: int(sp.NodePort),
			Endpoints: ready,
		})
	}
	return st, nil
}

// slicePort is the port the slice gives for the service port (matched by name, as
// the endpointslice controller names them), 0 when none.
func slicePort(s discoveryv1.EndpointSlice, sp corev1.ServicePort) int {
	for _, p := range s.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if name == sp.Name && p.Port != nil {
			return int(*p.Port)
		}
	}
	if len(s.Ports) == 0 && sp.TargetPort.Type == intstr.Int {
		return sp.TargetPort.IntValue()
	}
	return 0
}
