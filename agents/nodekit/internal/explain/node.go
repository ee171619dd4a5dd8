package explain

import (
	"fmt"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
)

// DefaultNodeMonitorGracePeriod is kube-controller-manager's --node-monitor-grace-period
// default since v1.32: a Lease older than this makes the node Unknown.
const DefaultNodeMonitorGracePeriod = 50 * time.Second

// DefaultToleration is how long the DefaultTolerationSeconds admission plugin lets
// a pod stay on a not-ready or unreachable node (tolerationSeconds 300).
const DefaultToleration = 300 * time.Second

// The node lifecycle controller's words for a silent node, and the taints it sets.
const (
	reasonNodeStatusUnknown = "NodeStatusUnknown"
	taintUnreachable        = "node.kubernetes.io/unreachable"
	taintNotReady           = "node.kubernetes.io/not-ready"
)

// NodeEvidence is what GatherNode found about one node.
type NodeEvidence struct {
	Name string `json:"name"`
	// Node is nil when the API server has no such Node.
	Node *corev1.Node `json:"-"`
	// Lease is the node's heartbeat in kube-node-lease; nil when there is none.
	Lease *coordinationv1.Lease `json:"-"`
	// Events are recent events about the node, any order.
	Events []corev1.Event `json:"-"`
	// GracePeriod is the cluster's node-monitor-grace-period; zero means
	// DefaultNodeMonitorGracePeriod.
	GracePeriod time.Duration `json:"-"`
	// Local holds what was read on the node itself; nil when explain ran elsewhere.
	Local *NodeLocal `json:"-"`
	// Problems are gathering errors (an API call that failed, a check that could not
	// run); they are reported as evidence.
	Problems []string `json:"-"`
}

// NodeLocal is what the node itself says.
type NodeLocal struct {
	// Kubelet is the kubelet's /healthz; nil when not checked.
	Kubelet *HTTPCheck
	// Runtime is the CRI runtime's Status; nil when not checked.
	Runtime *RuntimeCheck
	// CNI is the CNI configuration folder; nil when not checked.
	CNI *CNICheck
}

// HTTPCheck is one GET of a health endpoint.
type HTTPCheck struct {
	URL string
	// Err is set when the endpoint did not answer at all.
	Err string
	// Status is the HTTP status code when it answered.
	Status int
	Body   string
}

// OK reports a 200 answer.
func (c *HTTPCheck) OK() bool { return c != nil && c.Err == "" && c.Status == 200 }

// RuntimeCheck is the CRI runtime's Status call.
type RuntimeCheck struct {
	Endpoint string
	// Err is set when the runtime did not answer.
	Err string
	// RuntimeReady and NetworkReady are the two conditions, with their reason and
	// message as the runtime wrote them.
	RuntimeReady   bool
	RuntimeReason  string
	RuntimeMessage string
	NetworkReady   bool
	NetworkReason  string
	NetworkMessage string
}

// CNICheck lists the CNI configuration folder.
type CNICheck struct {
	Dir   string
	Files []string
	Err   string
}

// DiagnoseNode explains one node from ev as of now.
func DiagnoseNode(ev NodeEvidence, now time.Time) Diagnosis {
	d := Diagnosis{Object: "node/" + ev.Name}
	if ev.Node == nil {
		d.Verdict = NodeNotFound
		d.Summary = fmt.Sprintf("There is no Node named %q: its kubelet never registered it, or it was deleted.", ev.Name)
		d.Evidence = append(d.Evidence, ev.Problems...)
		d.Next = []string{"kubectl get nodes -o wide"}
		return d
	}
	grace := ev.GracePeriod
	if grace <= 0 {
		grace = DefaultNodeMonitorGracePeriod
	}
	node := ev.Node
	ready := condition(node, corev1.NodeReady)
	leaseAge, hasLease := leaseAge(ev.Lease, now)

	// Evidence shared by every verdict, in the order a person would check it.
	d.Evidence = append(d.Evidence, leaseLine(ev.Lease, leaseAge, hasLease, grace, now))
	if ready != nil {
		d.Evidence = append(d.Evidence, conditionLine(ready, now))
	} else {
		d.Evidence = append(d.Evidence, "no Ready condition: the kubelet has not reported status yet")
	}
	for _, t := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		if c := condition(node, t); c != nil && c.Status == corev1.ConditionTrue {
			d.Evidence = append(d.Evidence, conditionLine(c, now))
		}
	}
	for _, t := range node.Spec.Taints {
		d.Evidence = append(d.Evidence, taintLine(t, now))
	}
	if node.Spec.Unschedulable {
		d.Evidence = append(d.Evidence, "the node is cordoned (spec.unschedulable): no new pods are scheduled here")
	}
	d.Evidence = append(d.Evidence, localLines(ev.Local)...)
	d.Evidence = append(d.Evidence, eventLines(ev.Events, now, 5)...)
	d.Evidence = append(d.Evidence, ev.Problems...)

	readyMsg := ""
	if ready != nil {
		readyMsg = ready.Message
	}
	local := ev.Local
	if local == nil {
		local = &NodeLocal{}
	}
	// Seen from the API, the kubelet is silent when its Lease is older than the grace
	// period or the node controller has marked the node Unknown. On the node, its own
	// /healthz settles whether it is down, or up but not reaching the API server.
	quietToAPI := (hasLease && leaseAge > grace) || (ready != nil && ready.Status == corev1.ConditionUnknown)
	kubeletDown := local.Kubelet != nil && !local.Kubelet.OK()
	kubeletUp := local.Kubelet.OK()

	switch {
	case quietToAPI && kubeletUp && ready != nil && ready.Status == corev1.ConditionUnknown:
		d.Verdict = KubeletSilent
		d.Summary = fmt.Sprintf("The kubelet on %s is running (its /healthz answers) but its heartbeats do not reach the API server: the last Lease renewal the cluster saw was %s, and the node controller marked the node Unknown. Its containers keep running. Look at the kubelet's connection to the API server (network, credentials, the API server's load).", ev.Name, ago(now, now.Add(-leaseAge)))
		d.Next = []string{
			"journalctl -u kubelet --no-pager -n 50   # on " + ev.Name + ": errors talking to the API server",
			"kubectl get --raw /readyz",
		}
	case kubeletDown || (quietToAPI && !kubeletUp):
		d.Verdict = KubeletSilent
		d.Summary = silentSummary(ev, ready, leaseAge, hasLease, grace, now)
		d.Next = []string{
			"journalctl -u kubelet --no-pager -n 50   # on " + ev.Name + ": why the kubelet stopped",
			"crictl ps   # on " + ev.Name + ": the containers that may still be serving",
			"kubectl get pods -A -o wide --field-selector spec.nodeName=" + ev.Name,
		}
	case runtimeDown(local.Runtime, readyMsg):
		d.Verdict = RuntimeDown
		d.Summary = fmt.Sprintf("The container runtime on %s is down. The kubelet is alive and heartbeating, but it cannot start, stop or even list containers, so it reports the node NotReady. Restart the runtime (containerd) and the node turns Ready on the kubelet's next status update.", ev.Name)
		d.Next = []string{
			"systemctl status containerd   # on " + ev.Name,
			"crictl info   # on " + ev.Name + ": does the runtime answer?",
			"journalctl -u kubelet --no-pager -n 20   # on " + ev.Name,
		}
	case networkNotReady(local.Runtime, readyMsg):
		d.Verdict = NetworkNotReady
		d.Summary = networkSummary(ev.Name, local)
		dir := "/etc/cni/net.d"
		if local.CNI != nil && local.CNI.Dir != "" {
			dir = local.CNI.Dir
		}
		d.Next = []string{
			"ls -l " + dir + "   # on " + ev.Name + ": is there a CNI config?",
			"crictl info   # on " + ev.Name + ": the runtime's NetworkReady condition",
			"journalctl -u kubelet --no-pager -n 20   # on " + ev.Name,
		}
	case pressure(node) != "":
		d.Verdict = NodePressure
		d.Summary = fmt.Sprintf("%s is under %s. The kubelet is healthy and keeps reporting, but it taints the node so new pods go elsewhere and evicts pods to relieve the pressure.", ev.Name, pressure(node))
		d.Next = []string{
			"kubectl describe node " + ev.Name,
			"df -h; free -m   # on " + ev.Name,
		}
	case ready == nil || ready.Status != corev1.ConditionTrue:
		d.Verdict = NodeNotReady
		if ready == nil {
			d.Summary = fmt.Sprintf("%s has not reported a Ready condition yet: its kubelet registered the node but has not posted status. Give it a few seconds; if it stays so, read the kubelet's log.", ev.Name)
		} else {
			d.Summary = fmt.Sprintf("%s is NotReady although its kubelet is heartbeating: the kubelet says %q (%s).", ev.Name, ready.Message, ready.Reason)
		}
		d.Next = []string{
			"journalctl -u kubelet --no-pager -n 20   # on " + ev.Name,
			"kubectl describe node " + ev.Name,
		}
	default:
		d.Verdict = NodeHealthy
		d.Healthy = true
		d.Summary = fmt.Sprintf("%s is Ready: its kubelet renewed its Lease %s and reports the runtime and its network ready.", ev.Name, ago(now, now.Add(-leaseAge)))
		if !hasLease {
			d.Summary = fmt.Sprintf("%s is Ready.", ev.Name)
		}
		d.Next = []string{"kubectl get pods -A -o wide --field-selector spec.nodeName=" + ev.Name}
	}
	return d
}

func condition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

func leaseAge(l *coordinationv1.Lease, now time.Time) (time.Duration, bool) {
	if l == nil || l.Spec.RenewTime == nil {
		return 0, false
	}
	return now.Sub(l.Spec.RenewTime.Time), true
}

func leaseLine(l *coordinationv1.Lease, age time.Duration, ok bool, grace time.Duration, now time.Time) string {
	switch {
	case l == nil:
		return "no Lease in kube-node-lease: the kubelet has never sent a heartbeat"
	case !ok:
		return "Lease kube-node-lease/" + l.Name + " has never been renewed"
	case age > grace:
		return fmt.Sprintf("Lease kube-node-lease/%s last renewed %s (at %s), longer than the %s grace period", l.Name, ago(now, now.Add(-age)), l.Spec.RenewTime.UTC().Format(time.RFC3339), human(grace))
	default:
		return fmt.Sprintf("Lease kube-node-lease/%s renewed %s (grace period %s)", l.Name, ago(now, now.Add(-age)), human(grace))
	}
}

func conditionLine(c *corev1.NodeCondition, now time.Time) string {
	s := fmt.Sprintf("condition %s=%s", c.Type, c.Status)
	if c.Reason != "" {
		s += " reason " + c.Reason
	}
	if c.Message != "" {
		s += fmt.Sprintf(": %q", c.Message)
	}
	if !c.LastTransitionTime.IsZero() {
		s += " since " + ago(now, c.LastTransitionTime.Time)
	}
	return s
}

func taintLine(t corev1.Taint, now time.Time) string {
	s := fmt.Sprintf("taint %s:%s", t.Key, t.Effect)
	if t.TimeAdded != nil {
		s += " added " + ago(now, t.TimeAdded.Time)
		if t.Effect == corev1.TaintEffectNoExecute && (t.Key == taintUnreachable || t.Key == taintNotReady) {
			evict := t.TimeAdded.Add(DefaultToleration)
			if evict.After(now) {
				s += fmt.Sprintf("; pods with the default %s toleration are evicted in %s (at %s)", human(DefaultToleration), human(evict.Sub(now)), evict.UTC().Format(time.RFC3339))
			} else {
				s += fmt.Sprintf("; pods with the default %s toleration have been evicted since %s", human(DefaultToleration), ago(now, evict))
			}
		}
	}
	return s
}

func localLines(l *NodeLocal) []string {
	if l == nil {
		return []string{"not run on the node: kubelet /healthz, runtime status and CNI config not checked (run explain on the node for them)"}
	}
	var out []string
	if c := l.Kubelet; c != nil {
		switch {
		case c.Err != "":
			out = append(out, fmt.Sprintf("kubelet %s does not answer: %s", c.URL, c.Err))
		case c.Status != 200:
			out = append(out, fmt.Sprintf("kubelet %s answered %d: %s", c.URL, c.Status, strings.TrimSpace(c.Body)))
		default:
			out = append(out, fmt.Sprintf("kubelet %s answered ok", c.URL))
		}
	}
	if r := l.Runtime; r != nil {
		if r.Err != "" {
			out = append(out, fmt.Sprintf("container runtime %s does not answer: %s", r.Endpoint, r.Err))
		} else {
			out = append(out, fmt.Sprintf("container runtime %s: %s; %s", r.Endpoint,
				criCondition("RuntimeReady", r.RuntimeReady, r.RuntimeReason, r.RuntimeMessage),
				criCondition("NetworkReady", r.NetworkReady, r.NetworkReason, r.NetworkMessage)))
		}
	}
	if c := l.CNI; c != nil {
		switch {
		case c.Err != "":
			out = append(out, fmt.Sprintf("CNI config folder %s: %s", c.Dir, c.Err))
		case len(c.Files) == 0:
			out = append(out, fmt.Sprintf("CNI config folder %s is empty", c.Dir))
		default:
			out = append(out, fmt.Sprintf("CNI config folder %s holds %s", c.Dir, strings.Join(c.Files, ", ")))
		}
	}
	return out
}

// criCondition prints a runtime condition as the kubelet quotes it.
func criCondition(typ string, ok bool, reason, message string) string {
	s := fmt.Sprintf("%s=%t", typ, ok)
	if reason != "" {
		s += " reason:" + reason
	}
	if message != "" {
		s += " message:" + message
	}
	return s
}

func eventLines(events []corev1.Event, now time.Time, max int) []string {
	evs := append([]corev1.Event(nil), events...)
	last := func(e corev1.Event) time.Time {
		switch {
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		default:
			return e.CreationTimestamp.Time
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return last(evs[i]).After(last(evs[j])) })
	if len(evs) > max {
		evs = evs[:max]
	}
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, fmt.Sprintf("event %s %s: %s (%s)", e.Type, e.Reason, strings.TrimSpace(e.Message), ago(now, last(e))))
	}
	return out
}

func silentSummary(ev NodeEvidence, ready *corev1.NodeCondition, age time.Duration, hasLease bool, grace time.Duration, now time.Time) string {
	var b strings.Builder
	switch {
	case hasLease && age > grace:
		fmt.Fprintf(&b, "The kubelet on %s went quiet: its last heartbeat was %s, longer than the %s grace period", ev.Name, ago(now, now.Add(-age)), human(grace))
		if ready != nil && ready.Status == corev1.ConditionUnknown && ready.Reason == reasonNodeStatusUnknown {
			b.WriteString(", so the node controller marked the node Unknown (NotReady)")
		}
		b.WriteString(". ")
	case hasLease && ready != nil && ready.Status == corev1.ConditionUnknown:
		fmt.Fprintf(&b, "The kubelet on %s went quiet and has just come back: its Lease was renewed %s, but Ready is still Unknown from the silence and turns back on its next status update. ", ev.Name, ago(now, now.Add(-age)))
	default:
		fmt.Fprintf(&b, "The kubelet on %s is not answering on the node itself. ", ev.Name)
	}
	b.WriteString("NotReady here does not mean the pods died: their containers may still be running and serving traffic; the cluster just cannot see them.")
	if r := localRuntime(ev.Local); r != nil && r.Err == "" && r.RuntimeReady {
		b.WriteString(" The container runtime on the node still answers, so they very likely are.")
	}
	for _, t := range ev.Node.Spec.Taints {
		if t.Key == taintUnreachable && t.Effect == corev1.TaintEffectNoExecute && t.TimeAdded != nil {
			evict := t.TimeAdded.Add(DefaultToleration)
			if evict.After(now) {
				fmt.Fprintf(&b, " Unless it returns, its pods are evicted in %s (the default %s toleration of the unreachable taint) and recreated elsewhere.", human(evict.Sub(now)), human(DefaultToleration))
			} else {
				fmt.Fprintf(&b, " Its pods' default %s toleration ran out %s: they are being evicted and recreated elsewhere.", human(DefaultToleration), ago(now, evict))
			}
		}
	}
	b.WriteString(" Restart the kubelet; the node turns Ready on its first heartbeat.")
	return b.String()
}

func localRuntime(l *NodeLocal) *RuntimeCheck {
	if l == nil {
		return nil
	}
	return l.Runtime
}

func runtimeDown(r *RuntimeCheck, readyMsg string) bool {
	if r != nil && (r.Err != "" || !r.RuntimeReady) {
		return true
	}
	return strings.Contains(readyMsg, "container runtime is down") || strings.Contains(readyMsg, "container runtime not ready")
}

func networkNotReady(r *RuntimeCheck, readyMsg string) bool {
	if r != nil && r.Err == "" && !r.NetworkReady {
		return true
	}
	return strings.Contains(readyMsg, "network not ready") || strings.Contains(readyMsg, "NetworkPluginNotReady")
}

func networkSummary(name string, l *NodeLocal) string {
	var b strings.Builder
	fmt.Fprintf(&b, "The container runtime on %s is up, but its network is not ready: the CNI plugin (the piece that gives each pod its IP address) has not initialized", name)
	if r := l.Runtime; r != nil && r.NetworkMessage != "" {
		fmt.Fprintf(&b, " (%q)", r.NetworkMessage)
	}
	b.WriteString(". No pod can get an address, so the kubelet honestly refuses to report Ready.")
	if c := l.CNI; c != nil && c.Err == "" && len(c.Files) == 0 {
		fmt.Fprintf(&b, " %s holds no CNI config.", c.Dir)
	}
	b.WriteString(" Fix the network plugin and the node turns Ready on its own.")
	return b.String()
}

func pressure(node *corev1.Node) string {
	var kinds []string
	for _, p := range []struct {
		t    corev1.NodeConditionType
		name string
	}{{corev1.NodeMemoryPressure, "memory pressure"}, {corev1.NodeDiskPressure, "disk pressure"}, {corev1.NodePIDPressure, "PID pressure"}} {
		if c := condition(node, p.t); c != nil && c.Status == corev1.ConditionTrue {
			kinds = append(kinds, p.name)
		}
	}
	return strings.Join(kinds, " and ")
}
