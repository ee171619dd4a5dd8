package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nodekit-dev/nodekit/rules"
)

// ServiceEvidence is what GatherService found about one Service.
type ServiceEvidence struct {
	Namespace, Name string
	// Service is nil when the API server has no such Service.
	Service *corev1.Service
	// Slices are the Service's EndpointSlices (label kubernetes.io/service-name).
	Slices []discoveryv1.EndpointSlice
	// KubeProxy is kube-proxy's /healthz on this node; nil when not checked.
	KubeProxy *ProxyHealth
	// Rules is the kernel's view of this Service on this node; nil when not checked.
	Rules *RulesCheck
	// Problems are gathering errors, reported as evidence.
	Problems []string
}

// ProxyHealth is one GET of kube-proxy's /healthz.
type ProxyHealth struct {
	URL string
	// Err is set when kube-proxy did not answer at all.
	Err    string
	Status int
	// LastUpdated is the last time kube-proxy's rules were in sync, as it reports it
	// (upstream reports "now" while healthy); zero when the body could not be read.
	LastUpdated time.Time
}

// RulesCheck is the kernel's rules for the Service, read back and compared with the
// EndpointSlices.
type RulesCheck struct {
	// Backend names what was read ("nftables table ip kube-proxy").
	Backend string
	Err     string
	// Kernel are the kernel's destinations for this Service's cluster IP.
	Kernel []rules.KernelService
	// Drift are the differences for this Service's ports only.
	Drift []rules.Drift
	// Traces are where a new connection from the traced client lands, one line per port.
	Traces []string
}

// endpointState is one endpoint address with its conditions resolved as the API
// defines their nil values (ready nil = true, serving nil = ready, terminating nil =
// false).
type endpointState struct {
	ip                          string
	pod                         string
	ready, serving, terminating bool
}

func endpointStates(slices []discoveryv1.EndpointSlice) []endpointState {
	seen := map[string]bool{}
	var out []endpointState
	for _, s := range slices {
		for _, e := range s.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := ready
			if e.Conditions.Serving != nil {
				serving = *e.Conditions.Serving
			}
			terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			pod := ""
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				pod = e.TargetRef.Name
			}
			for _, a := range e.Addresses {
				if seen[a] {
					continue
				}
				seen[a] = true
				out = append(out, endpointState{ip: a, pod: pod, ready: ready, serving: serving, terminating: terminating})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ip < out[j].ip })
	return out
}

func (e endpointState) String() string {
	s := e.ip
	if e.pod != "" {
		s += " (pod " + e.pod + ")"
	}
	return fmt.Sprintf("%s ready=%t serving=%t terminating=%t", s, e.ready, e.serving, e.terminating)
}

// DiagnoseService explains one Service from ev as of now.
func DiagnoseService(ev ServiceEvidence, now time.Time) Diagnosis {
	key := ev.Namespace + "/" + ev.Name
	d := Diagnosis{Object: "service/" + key}
	if ev.Service == nil {
		d.Verdict = ServiceNotFound
		d.Summary = fmt.Sprintf("There is no Service %s.", key)
		d.Evidence = append(d.Evidence, ev.Problems...)
		d.Next = []string{"kubectl get services -n " + ev.Namespace}
		return d
	}
	svc := ev.Service
	eps := endpointStates(ev.Slices)
	var ready, notReady []endpointState
	for _, e := range eps {
		if e.ready {
			ready = append(ready, e)
		} else {
			notReady = append(notReady, e)
		}
	}

	d.Evidence = append(d.Evidence, serviceLine(svc))
	d.Evidence = append(d.Evidence, fmt.Sprintf("%d EndpointSlice(s): %d endpoint(s), %d ready", len(ev.Slices), len(eps), len(ready)))
	for _, e := range eps {
		d.Evidence = append(d.Evidence, "endpoint "+e.String())
	}
	d.Evidence = append(d.Evidence, proxyLines(ev.KubeProxy, now)...)
	d.Evidence = append(d.Evidence, rulesLines(ev.Rules)...)
	d.Evidence = append(d.Evidence, ev.Problems...)

	stale, missing, noRule, wrong := driftSummary(ev.Rules)
	proxyDown := ev.KubeProxy != nil && ev.KubeProxy.Err != ""
	proxyStale := ev.KubeProxy != nil && ev.KubeProxy.Err == "" && ev.KubeProxy.Status != 200
	selector := labelsString(svc.Spec.Selector)
	clusterIP := svc.Spec.ClusterIP

	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		d.Verdict = ServiceHealthy
		d.Healthy = true
		d.Summary = fmt.Sprintf("%s is an ExternalName Service: DNS answers a CNAME for %s; kube-proxy writes no rules for it.", key, svc.Spec.ExternalName)
		d.Next = []string{"kubectl run -it --rm dnscheck --image=busybox --restart=Never -- nslookup " + ev.Name + "." + ev.Namespace}
	case proxyDown || proxyStale:
		d.Verdict = KubeProxyDown
		what := "kube-proxy on this node is not running (its /healthz does not answer)"
		if proxyStale {
			d.Verdict = KubeProxyStale
			what = "kube-proxy on this node is alive but no longer keeping the rules up to date (its /healthz answers " + fmt.Sprint(ev.KubeProxy.Status) + ")"
			if !ev.KubeProxy.LastUpdated.IsZero() {
				what += ", last in sync " + ago(now, ev.KubeProxy.LastUpdated)
			}
		}
		d.Summary = blackholeSummary(key, what, clusterIP, stale, missing, noRule, wrong, ev.Rules != nil && ev.Rules.Err == "")
		d.Next = []string{
			"systemctl restart kube-proxy   # or: kubectl -n kube-system delete pod -l k8s-app=kube-proxy --field-selector spec.nodeName=NODE",
			"nft list table ip kube-proxy   # on the node: the rules as they stand",
			"kubectl get endpointslices -n " + ev.Namespace + " -l kubernetes.io/service-name=" + ev.Name + " -o wide",
		}
	case len(eps) == 0:
		d.Verdict = ServiceNoEndpoints
		if len(svc.Spec.Selector) == 0 {
			d.Summary = fmt.Sprintf("%s has no endpoints, and no selector: nothing fills its EndpointSlices unless you create them yourself. kube-proxy makes connections to %s fail at once (REJECT) rather than hang.", key, clusterIP)
		} else {
			d.Summary = fmt.Sprintf("%s has no endpoints: no pod matches its selector %s (or none has an IP yet). kube-proxy makes connections to %s fail at once (REJECT) rather than hang. The pods are the problem, not the network.", key, selector, clusterIP)
		}
		d.Next = []string{
			"kubectl get pods -n " + ev.Namespace + " -l " + selector + " -o wide",
			"kubectl describe service -n " + ev.Namespace + " " + ev.Name,
		}
	case len(ready) == 0:
		d.Verdict = ServiceEndpointsNotReady
		var names []string
		for _, e := range notReady {
			names = append(names, e.ip)
		}
		d.Summary = fmt.Sprintf("%s has %d endpoint(s) (%s) but none is ready: their pods exist but fail their readiness probes or are terminating, so kube-proxy sends no new connections to them and %s rejects. Look at the pods, not at the network.", key, len(notReady), strings.Join(names, ", "), clusterIP)
		d.Next = []string{
			"kubectl get pods -n " + ev.Namespace + " -l " + selector + " -o wide",
			"kubectl describe pods -n " + ev.Namespace + " -l " + selector + "   # the failing readiness probe",
		}
	case len(stale) > 0 || len(missing) > 0 || noRule || wrong != "":
		d.Verdict = RulesDrift
		d.Summary = blackholeSummary(key, "kube-proxy answers healthy, yet the kernel's rules disagree with the EndpointSlices (it may be catching up: run explain again in a few seconds)", clusterIP, stale, missing, noRule, wrong, true)
		d.Next = []string{
			"nft list table ip kube-proxy   # on the node",
			"kubectl get endpointslices -n " + ev.Namespace + " -l kubernetes.io/service-name=" + ev.Name + " -o wide",
		}
	default:
		d.Verdict = ServiceHealthy
		d.Healthy = true
		var ips []string
		for _, e := range ready {
			ips = append(ips, e.ip)
		}
		d.Summary = fmt.Sprintf("%s has %d ready endpoint(s) (%s).", key, len(ready), strings.Join(ips, ", "))
		switch {
		case ev.Rules != nil && ev.Rules.Err == "":
			d.Summary += " kube-proxy is healthy and the kernel's rules on this node send " + clusterIP + " to exactly those endpoints."
		case ev.KubeProxy != nil:
			d.Summary += " kube-proxy on this node is healthy (its rules were not read back)."
		default:
			d.Summary += " kube-proxy and the kernel's rules were not checked: run explain on a node for them."
		}
		if len(notReady) > 0 {
			d.Summary += fmt.Sprintf(" %d more endpoint(s) are not ready and get no new connections.", len(notReady))
		}
		d.Next = []string{"kubectl get endpointslices -n " + ev.Namespace + " -l kubernetes.io/service-name=" + ev.Name + " -o wide"}
	}
	return d
}

func serviceLine(svc *corev1.Service) string {
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%d/%s->%s", p.Port, p.Protocol, p.TargetPort.String()))
	}
	sel := labelsString(svc.Spec.Selector)
	if sel == "" {
		sel = "(none)"
	}
	return fmt.Sprintf("Service type %s clusterIP %s ports %s selector %s", svc.Spec.Type, svc.Spec.ClusterIP, strings.Join(ports, ","), sel)
}

func labelsString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func proxyLines(p *ProxyHealth, now time.Time) []string {
	if p == nil {
		return []string{"not run on a node: kube-proxy /healthz and the kernel's rules not checked"}
	}
	switch {
	case p.Err != "":
		return []string{fmt.Sprintf("kube-proxy %s does not answer: %s", p.URL, p.Err)}
	case p.Status != 200:
		s := fmt.Sprintf("kube-proxy %s answered %d", p.URL, p.Status)
		if !p.LastUpdated.IsZero() {
			s += ", rules last in sync " + ago(now, p.LastUpdated)
		}
		return []string{s}
	default:
		return []string{fmt.Sprintf("kube-proxy %s answered 200 (rules in sync)", p.URL)}
	}
}

func rulesLines(r *RulesCheck) []string {
	if r == nil {
		return nil
	}
	if r.Err != "" {
		return []string{fmt.Sprintf("kernel rules (%s) could not be read: %s", r.Backend, r.Err)}
	}
	var out []string
	if len(r.Kernel) == 0 {
		out = append(out, fmt.Sprintf("kernel rules (%s): no rule for this Service", r.Backend))
	}
	for _, k := range r.Kernel {
		var eps []string
		for _, e := range k.Endpoints {
			eps = append(eps, e.String())
		}
		line := fmt.Sprintf("kernel rule (%s): %s -> %s", r.Backend, k.Dest, k.Action)
		if len(eps) > 0 {
			line += " " + strings.Join(eps, ", ")
		}
		out = append(out, line)
	}
	for _, dr := range r.Drift {
		out = append(out, "drift: "+dr.String())
	}
	return append(out, r.Traces...)
}

// driftSummary lists the stale endpoint IPs (rules aiming at addresses no
// EndpointSlice has), the missing ones (ready endpoints no rule reaches), whether a
// service port has no rule at all, and a wrong verdict (rejecting although endpoints
// exist, or the reverse) in the kernel's words.
func driftSummary(r *RulesCheck) (stale, missing []string, noRule bool, wrong string) {
	if r == nil || r.Err != "" {
		return nil, nil, false, ""
	}
	for _, dr := range r.Drift {
		switch dr.Kind {
		case rules.StaleEndpoint:
			stale = appendAddr(stale, dr.Detail, " still goes to ")
		case rules.MissingEndpoint:
			missing = appendAddr(missing, dr.Detail, " never reaches ")
		case rules.MissingService:
			noRule = true
		case rules.WrongVerdict:
			wrong = dr.Detail
		}
	}
	return stale, missing, noRule, wrong
}

// appendAddr takes the endpoint after sep in a Drift detail ("10.96.0.5 . tcp . 80
// still goes to 10.244.1.7:8080") and adds it once.
func appendAddr(list []string, detail, sep string) []string {
	_, after, ok := strings.Cut(detail, sep)
	if !ok {
		return list
	}
	after = strings.TrimSpace(after)
	if ap, err := netip.ParseAddrPort(after); err == nil {
		after = ap.Addr().String()
	}
	if slices.Contains(list, after) {
		return list
	}
	return append(list, after)
}

func blackholeSummary(key, what, clusterIP string, stale, missing []string, noRule bool, wrong string, rulesRead bool) string {
	var b strings.Builder
	b.WriteString(what)
	b.WriteString(". ")
	switch {
	case !rulesRead:
		fmt.Fprintf(&b, "The rules it wrote for %s stay in the kernel but are no longer updated: any pod replaced since then is unreachable through %s while every pod still reads Running.", key, clusterIP)
	case len(stale) > 0 || len(missing) > 0 || noRule || wrong != "":
		fmt.Fprintf(&b, "The kernel's rules for %s no longer match its endpoints:", key)
		if wrong != "" {
			fmt.Fprintf(&b, " %s", wrong)
			if len(stale) > 0 || len(missing) > 0 || noRule {
				b.WriteString(";")
			}
		}
		if len(stale) > 0 {
			fmt.Fprintf(&b, " they still send connections to %s, which no EndpointSlice lists any more (gone pods: those connections blackhole)", strings.Join(stale, ", "))
		}
		if len(missing) > 0 {
			if len(stale) > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(&b, " the ready endpoint(s) %s get no traffic through %s", strings.Join(missing, ", "), clusterIP)
		}
		if noRule {
			if len(stale) > 0 || len(missing) > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(&b, " there is no rule at all for %s, so connections to it go nowhere", clusterIP)
		}
		b.WriteString(". Every pod still reads Running: this is the Service's health, not the pods'.")
	default:
		fmt.Fprintf(&b, "The rules it last wrote for %s still match the endpoints, so traffic flows for now; the next pod that is replaced will not be reachable until kube-proxy runs again.", key)
	}
	return b.String()
}
