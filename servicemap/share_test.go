package servicemap

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func shareTestObjects(name, rv string, ready bool) (*v1.Service, *discovery.EndpointSlice) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("s-" + name), ResourceVersion: rv},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	port, http := int32(8080), "http"
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-a", UID: types.UID("e-" + name), ResourceVersion: rv,
			Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &http, Port: &port}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.0.0.1"}},
		},
	}
	return svc, es
}

// The memory rules the tracker relies on: a port fed by one single-port slice
// shares that slice's endpoint list, the Service's ports are the snapshot's ports
// (not a second copy), and a service untouched by a change keeps its very ports in
// the next snapshot.
func TestTrackerSharesUnchangedState(t *testing.T) {
	tr := NewTracker(Config{})
	for _, name := range []string{"a", "b"} {
		svc, es := shareTestObjects(name, "1", true)
		tr.OnServiceAdd(svc)
		tr.OnEndpointSliceAdd(es)
	}
	first := tr.Consume().Snapshot
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	entry, ok := tr.applied.get(a)
	require.True(t, ok)
	require.Len(t, entry.ports, 1)
	require.Len(t, entry.slices, 1)
	sp := entry.ports[0]
	require.Len(t, sp.Endpoints, 2)
	assert.True(t, sameArray(sp.Endpoints, entry.slices[0].eps), "port shares the slice's endpoint list")
	assert.Equal(t, "10.0.0.1:8080", sp.Endpoints[0].String(), "sorted, port filled in")

	_, es := shareTestObjects("b", "2", false)
	tr.OnEndpointSliceUpdate(nil, es)
	u := tr.Consume()
	assert.Equal(t, []types.NamespacedName{{Namespace: "ns", Name: "b"}}, u.ChangedServices)
	assert.Same(t, first.Service(a)[0], u.Snapshot.Service(a)[0], "unchanged service: same ports")
	next, _ := tr.applied.get(types.NamespacedName{Namespace: "ns", Name: "b"})
	assert.True(t, sameArray(next.ports[0].Endpoints, next.slices[0].eps))
	old := first.Service(types.NamespacedName{Namespace: "ns", Name: "b"})[0]
	assert.Equal(t, CondTrue, old.Endpoints[1].Ready, "the earlier snapshot is untouched")
}

// Slices named "<service>-..." are found by name, without an index entry; others
// need one. Either way a slice that loses its label or is deleted without it
// leaves the service it was filed under, even when its name also starts with
// another service's name.
func TestSliceOwnerFoundByName(t *testing.T) {
	tr := NewTracker(Config{})
	mk := func(slice, label string) *discovery.EndpointSlice {
		_, es := shareTestObjects("x", "", true)
		es.Name = slice
		if label == "" {
			es.Labels = nil
		} else {
			es.Labels = map[string]string{discovery.LabelServiceName: label}
		}
		return es
	}
	for _, name := range []string{"a", "a-b", "c"} {
		svc, _ := shareTestObjects(name, "", true)
		tr.OnServiceAdd(svc)
	}
	tr.OnEndpointSliceAdd(mk("a-b-x1", "a"))   // named after a-b's prefix too, filed under a
	tr.OnEndpointSliceAdd(mk("a-b-x2", "a-b")) // named after a-b
	tr.OnEndpointSliceAdd(mk("custom", "c"))   // not named after its service
	tr.Consume()
	assert.Equal(t, map[types.NamespacedName]string{{Namespace: "ns", Name: "custom"}: "c"}, tr.sliceOwner)
	epsOf := func(svc string) int {
		e, ok := tr.applied.get(types.NamespacedName{Namespace: "ns", Name: svc})
		require.True(t, ok)
		return len(e.ports[0].Endpoints)
	}
	require.Equal(t, 2, epsOf("a"))
	require.Equal(t, 2, epsOf("a-b"))
	require.Equal(t, 2, epsOf("c"))

	tr.OnEndpointSliceUpdate(nil, mk("a-b-x1", "")) // label removed
	tr.OnEndpointSliceDelete(mk("custom", ""))      // deleted without its label
	u := tr.Consume()
	assert.Equal(t, []types.NamespacedName{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "c"}}, u.ChangedServices)
	assert.Equal(t, 0, epsOf("a"))
	assert.Equal(t, 2, epsOf("a-b"), "the other service with the same name prefix is untouched")
	assert.Equal(t, 0, epsOf("c"))
	assert.Empty(t, tr.sliceOwner)

	tr.OnEndpointSliceAdd(mk("a-b-x2", "c")) // relabelled: leaves a-b for c
	u = tr.Consume()
	assert.Equal(t, []types.NamespacedName{{Namespace: "ns", Name: "a-b"}, {Namespace: "ns", Name: "c"}}, u.ChangedServices)
	assert.Equal(t, 0, epsOf("a-b"))
	assert.Equal(t, 2, epsOf("c"))
}
