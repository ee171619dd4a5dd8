// Package leasetest is a fake API server for code that writes or reads Leases,
// for users' own unit tests of a lease.Controller or lease.Watcher embedded in
// their agent.
//
// # What the fake does
//
// Fake wraps client-go's fake clientset and makes leases behave like the real API
// server on the points the heartbeat depends on: every write gets a new
// resourceVersion, an Update carrying a stale resourceVersion fails with a
// Conflict, Create of an existing lease fails with AlreadyExists. Requests on
// leases and nodes are recorded as text ("update kube-node-lease/node-1") so a test
// can assert the exact traffic, and FailNext injects any API error for the next N
// requests of one verb and resource.
//
// # Using it
//
//	f := leasetest.New(leasetest.Node("node-1", "uid-1"))
//	f.FailNext("update", "leases", 2, leasetest.ServerTimeout())
//	cfg := lease.NodeConfig(f.Clientset, "node-1")
//	cfg.Clock = fakeClock
//	...
//	if got := f.Requests(); ...
//
// The fake is safe for concurrent use.
package leasetest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

var leasesResource = coordinationv1.SchemeGroupVersion.WithResource("leases")

// Fake is a fake API server for leases and nodes. Build it with New.
type Fake struct {
	// Clientset is the client to hand to the code under test.
	Clientset *fake.Clientset

	mu       sync.Mutex
	requests []string
	failures map[string][]error // "verb resource" -> errors to return, in order
	rv       int64
	seedErr  error
}

// New returns a Fake holding objs (Nodes, Leases, ...).
func New(objs ...runtime.Object) *Fake {
	f := &Fake{Clientset: fake.NewClientset(), failures: map[string][]error{}}
	for _, o := range objs {
		if l, ok := o.(*coordinationv1.Lease); ok {
			l = l.DeepCopy()
			l.ResourceVersion = f.nextRV()
			o = l
		}
		if err := f.Clientset.Tracker().Add(o); err != nil && f.seedErr == nil {
			// A duplicate seed object: a bug in the test, reported by every request
			// rather than by a panic.
			f.seedErr = fmt.Errorf("leasetest.New: %w", err)
		}
	}
	f.Clientset.PrependReactor("*", "*", f.react)
	return f
}

func (f *Fake) nextRV() string {
	f.rv++
	return strconv.FormatInt(f.rv, 10)
}

// react records every request, returns injected errors, and gives leases the API
// server's resourceVersion semantics. Other requests fall through to the tracker.
func (f *Fake) react(action clienttesting.Action) (bool, runtime.Object, error) {
	verb, resource := action.GetVerb(), action.GetResource().Resource
	if resource != "leases" && resource != "nodes" {
		return false, nil, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, describe(action))
	if f.seedErr != nil {
		return true, nil, f.seedErr
	}
	key := verb + " " + resource
	if errs := f.failures[key]; len(errs) > 0 {
		f.failures[key] = errs[1:]
		return true, nil, errs[0]
	}
	if resource != "leases" {
		return false, nil, nil
	}
	tracker := f.Clientset.Tracker()
	switch verb {
	case "create":
		l, ok := action.(clienttesting.CreateAction).GetObject().(*coordinationv1.Lease)
		if !ok {
			return false, nil, nil
		}
		if _, err := tracker.Get(leasesResource, l.Namespace, l.Name); err == nil {
			return true, nil, apierrors.NewAlreadyExists(leasesResource.GroupResource(), l.Name)
		}
		l = l.DeepCopy()
		l.ResourceVersion = f.nextRV()
		if l.UID == "" {
			l.UID = types.UID("lease-uid-" + l.ResourceVersion)
		}
		if err := tracker.Create(leasesResource, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	case "update":
		l, ok := action.(clienttesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if !ok {
			return false, nil, nil
		}
		cur, err := tracker.Get(leasesResource, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		curRV := cur.(*coordinationv1.Lease).ResourceVersion
		if l.ResourceVersion != "" && l.ResourceVersion != curRV {
			return true, nil, apierrors.NewConflict(leasesResource.GroupResource(), l.Name,
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
		}
		l = l.DeepCopy()
		l.ResourceVersion = f.nextRV()
		if err := tracker.Update(leasesResource, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	}
	return false, nil, nil
}

func describe(a clienttesting.Action) string {
	name := ""
	switch a := a.(type) {
	case interface{ GetName() string }: // get, delete
		name = a.GetName()
	case interface{ GetObject() runtime.Object }: // create, update
		if m, err := metaName(a.GetObject()); err == nil {
			name = m
		}
	}
	target := a.GetResource().Resource
	if name != "" {
		target = name
		if a.GetNamespace() != "" {
			target = a.GetNamespace() + "/" + name
		}
	} else if a.GetNamespace() != "" {
		target = a.GetNamespace() + "/" + target
	}
	kind := strings.TrimSuffix(a.GetResource().Resource, "s")
	return a.GetVerb() + " " + kind + " " + target
}

func metaName(o runtime.Object) (string, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return "", fmt.Errorf("%T has no metadata", o)
	}
	return m.GetName(), nil
}

// FailNext makes the next n requests with this verb ("get", "create", "update",
// "list", "watch", "delete") on this resource ("leases" or "nodes") fail with err.
// Calls add up: FailNext twice with n=1 fails the next two.
func (f *Fake) FailNext(verb, resource string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := verb + " " + resource
	for range n {
		f.failures[key] = append(f.failures[key], err)
	}
}

// Requests returns the requests on leases and nodes so far, oldest first, each
// as "verb kind namespace/name" (for example "get lease kube-node-lease/node-1",
// "get node node-1"); list and watch read "list lease kube-node-lease/leases".
func (f *Fake) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// ResetRequests forgets the recorded requests.
func (f *Fake) ResetRequests() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = nil
}

// Lease returns a copy of the stored lease namespace/name.
func (f *Fake) Lease(namespace, name string) (*coordinationv1.Lease, error) {
	o, err := f.Clientset.Tracker().Get(leasesResource, namespace, name)
	if err != nil {
		return nil, err
	}
	return o.(*coordinationv1.Lease).DeepCopy(), nil
}

// Dump renders every stored lease as one line, sorted, for whole-state
// comparisons: "ns/name holder=H duration=40s renew=RFC3339Nano owners=Kind/name rv=N".
func (f *Fake) Dump() string {
	objs, err := f.Clientset.Tracker().List(leasesResource, coordinationv1.SchemeGroupVersion.WithKind("Lease"), "")
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	list, ok := objs.(*coordinationv1.LeaseList)
	if !ok {
		return fmt.Sprintf("error: unexpected list type %T\n", objs)
	}
	var lines []string
	for _, l := range list.Items {
		lines = append(lines, Line(&l))
	}
	sort.Strings(lines)
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// Line renders one lease as Dump does.
func Line(l *coordinationv1.Lease) string {
	holder, duration, renew := "-", "-", "-"
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds != nil {
		duration = (time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).String()
	}
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	var owners []string
	for _, o := range l.OwnerReferences {
		owners = append(owners, o.APIVersion+"/"+o.Kind+"/"+o.Name)
	}
	if len(owners) == 0 {
		owners = []string{"-"}
	}
	return fmt.Sprintf("%s/%s holder=%s duration=%s renew=%s owners=%s rv=%s",
		l.Namespace, l.Name, holder, duration, renew, strings.Join(owners, ","), l.ResourceVersion)
}

// SetRenewTime writes renewTime of the stored lease namespace/name as another
// writer would (bumping its resourceVersion), so the next Update from a cached
// copy meets a Conflict. It is not recorded in Requests.
func (f *Fake) SetRenewTime(namespace, name string, t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, err := f.Clientset.Tracker().Get(leasesResource, namespace, name)
	if err != nil {
		return err
	}
	l := o.(*coordinationv1.Lease).DeepCopy()
	l.Spec.RenewTime = &metav1.MicroTime{Time: t}
	l.ResourceVersion = f.nextRV()
	return f.Clientset.Tracker().Update(leasesResource, l, namespace)
}

// Node returns a Node named name with the given UID, to seed New.
func Node(name string, uid types.UID) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
}

// Lease returns a Lease to seed New, renewed at renew for duration.
func Lease(namespace, name, holder string, renew time.Time, duration time.Duration) *coordinationv1.Lease {
	secs := int32(duration / time.Second)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &secs,
			RenewTime:            &metav1.MicroTime{Time: renew},
		},
	}
}

// ServerTimeout is the error an overloaded or unreachable API server produces.
func ServerTimeout() error {
	return apierrors.NewServerTimeout(leasesResource.GroupResource(), "update", 1)
}

// Conflict is the error of an Update with a stale resourceVersion.
func Conflict(name string) error {
	return apierrors.NewConflict(leasesResource.GroupResource(), name, fmt.Errorf("the object has been modified"))
}

// NotFound is the error of a GET on a missing object of resource ("leases", "nodes").
func NotFound(resource, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
}

// Forbidden is the error the Node authorizer returns for another node's lease.
func Forbidden(name string) error {
	return apierrors.NewForbidden(leasesResource.GroupResource(), name, fmt.Errorf("node is not allowed to modify lease %q", name))
}
