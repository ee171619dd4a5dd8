package servicemap

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

// TestHAMTMatchesMap drives the trie and a plain map with the same random
// operations and checks they agree, and that every earlier version is unchanged.
func TestHAMTMatchesMap(t *testing.T) {
	t.Run("real hash", func(t *testing.T) { testHAMTMatchesMap(t, nil) })
	// A hash with 256 values makes keys share leaf chains (about 80 each).
	t.Run("colliding hash", func(t *testing.T) {
		testHAMTMatchesMap(t, func(k types.NamespacedName) uint64 { return hashName(k) & 0xff })
	})
}

func testHAMTMatchesMap(t *testing.T, hashFn func(types.NamespacedName) uint64) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := hamt{hashFn: hashFn}
	ref := map[types.NamespacedName]*serviceEntry{}
	type version struct {
		m   hamt
		ref map[types.NamespacedName]*serviceEntry
	}
	var versions []version
	// Operations run in batches (gen); each kept version ends one, like a Consume.
	gen := uint64(1)
	for i := 0; i < 20000; i++ {
		k := types.NamespacedName{Namespace: fmt.Sprintf("ns%d", rng.IntN(7)), Name: fmt.Sprintf("s%d", rng.IntN(3000))}
		if rng.IntN(3) == 0 {
			m = m.del(k)
			delete(ref, k)
		} else {
			e := &serviceEntry{}
			if i%2 == 0 {
				m = m.set(k, e)
			} else {
				m = m.setInBatch(k, e, gen)
			}
			ref[k] = e
		}
		if i%2500 == 0 {
			cp := make(map[types.NamespacedName]*serviceEntry, len(ref))
			for k, v := range ref {
				cp[k] = v
			}
			versions = append(versions, version{m, cp})
			gen++
		}
	}
	versions = append(versions, version{m, ref})
	for i, v := range versions {
		require.Equal(t, len(v.ref), v.m.size, "version %d size", i)
		for k, want := range v.ref {
			got, ok := v.m.get(k)
			require.True(t, ok, "version %d lost %v", i, k)
			require.Same(t, want, got)
		}
		seen := 0
		v.m.each(func(k types.NamespacedName, e *serviceEntry) bool {
			seen++
			assert.Same(t, v.ref[k], e)
			return true
		})
		assert.Equal(t, len(v.ref), seen)
	}
	// Deleting everything gives the empty trie.
	for k := range ref {
		m = m.del(k)
	}
	assert.Equal(t, 0, m.size)
	assert.Nil(t, m.root)
	_, ok := m.get(types.NamespacedName{Name: "x"})
	assert.False(t, ok)
}

func TestHAMTEachStops(t *testing.T) {
	var m hamt
	for i := 0; i < 100; i++ {
		m = m.set(types.NamespacedName{Name: fmt.Sprint(i)}, &serviceEntry{})
	}
	n := 0
	m.each(func(types.NamespacedName, *serviceEntry) bool { n++; return n < 10 })
	assert.Equal(t, 10, n)
}
