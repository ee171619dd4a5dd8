package servicemap

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestHandoffStore drives the Reflector's side of the store by hand: an add of a
// known object is an update, a re-list updates what it lists and deletes (with
// a stub) what it no longer lists, and the first re-list marks the initial list
// handed over.
func TestHandoffStore(t *testing.T) {
	var calls []string
	svc := func(name, rv string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	}
	s := &handoffStore[*v1.Service]{
		newStub: func(nn types.NamespacedName) *v1.Service {
			return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
		},
		add: func(o *v1.Service) { calls = append(calls, "add "+o.Name+" "+o.ResourceVersion) },
		update: func(old, o *v1.Service) {
			calls = append(calls, "update "+old.Name+"->"+o.Name+" "+old.ResourceVersion+"->"+o.ResourceVersion)
		},
		remove: func(o *v1.Service) { calls = append(calls, "delete "+o.Name+" "+o.ResourceVersion) },
	}
	h := s.init()
	select {
	case <-h.listed:
		t.Fatal("listed before the first Replace")
	default:
	}
	require.NoError(t, h.Replace([]any{svc("a", "1"), svc("b", "1")}, "1"))
	<-h.listed
	require.NoError(t, h.Add(svc("c", "2")))
	require.NoError(t, h.Add(svc("a", "3")))
	require.NoError(t, h.Update(svc("b", "4")))
	require.NoError(t, h.Delete(svc("c", "5")))
	require.NoError(t, h.Replace([]any{svc("b", "6"), svc("d", "6")}, "6"))
	require.NoError(t, h.Resync())
	require.ErrorContains(t, h.Add(&v1.Pod{}), "unexpected object of type *v1.Pod")
	assert.Equal(t, []string{
		"add a 1", "add b 1",
		"add c 2", "update a->a ->3", "update b->b ->4", "delete c 5",
		"update b->b ->6", "add d 6", "delete a ",
	}, calls)
	assert.Len(t, s.known, 2)
}
