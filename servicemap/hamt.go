package servicemap

import (
	"hash/maphash"
	"math/bits"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// A persistent hash array mapped trie from service name to its entry. Every
// change copies only the path from the root to the changed leaf (a handful of
// nodes of at most 32 pointers), so a Snapshot is just a root pointer: it costs
// nothing to take, never changes afterwards, and a change costs O(log32 n)
// regardless of how many snapshots are alive.

const (
	hamtBits  = 5
	hamtWidth = 1 << hamtBits
	hamtMask  = hamtWidth - 1
	// At this depth all 64 hash bits are used up; two different hashes always
	// differ in a slot above it, so only equal hashes share a leaf.
	hamtMaxDepth = (64 + hamtBits - 1) / hamtBits
)

var hashSeed = maphash.MakeSeed()

func hashName(n types.NamespacedName) uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	_, _ = h.WriteString(n.Namespace)
	_ = h.WriteByte('/')
	_, _ = h.WriteString(n.Name)
	return h.Sum64()
}

// hamtNode is an inner node: bitmap marks which of the 32 slots are present and
// children holds them in slot order, each a *hamtNode or a *hamtLeaf.
//
// gen is the batch that created the node (0: none). Within one batch, set may
// change the nodes that batch created in place: no snapshot has seen them yet.
// This spares a large batch (the initial sync) a path copy per insert.
type hamtNode struct {
	bitmap   uint32
	gen      uint64
	children []any
}

// hamtLeaf holds one key; keys whose full 64-bit hashes collide are chained
// through next (never in practice, but lookups stay exact).
type hamtLeaf struct {
	hash uint64
	key  types.NamespacedName
	val  *serviceEntry
	next *hamtLeaf
}

type hamt struct {
	root *hamtNode
	size int
	// hashFn replaces hashName when set (tests use it to force collisions).
	hashFn func(types.NamespacedName) uint64
}

func (m hamt) hash(key types.NamespacedName) uint64 {
	if m.hashFn != nil {
		return m.hashFn(key)
	}
	return hashName(key)
}

func slot(hash uint64, depth int) uint32 {
	return uint32(hash>>(uint(depth)*hamtBits)) & hamtMask
}

func (n *hamtNode) index(bit uint32) int {
	return bits.OnesCount32(n.bitmap & (bit - 1))
}

func (m hamt) get(key types.NamespacedName) (*serviceEntry, bool) {
	if m.root == nil {
		return nil, false
	}
	h := m.hash(key)
	n := m.root
	for depth := 0; ; depth++ {
		bit := uint32(1) << slot(h, depth)
		if n.bitmap&bit == 0 {
			return nil, false
		}
		switch c := n.children[n.index(bit)].(type) {
		case *hamtNode:
			n = c
		case *hamtLeaf:
			if c.hash != h {
				return nil, false
			}
			for l := c; l != nil; l = l.next {
				if l.key == key {
					return l.val, true
				}
			}
			return nil, false
		}
	}
}

// set returns a map with key bound to val; m is unchanged.
func (m hamt) set(key types.NamespacedName, val *serviceEntry) hamt {
	return m.setInBatch(key, val, 0)
}

// setInBatch is set as part of batch gen (non-zero): nodes created earlier in the
// same batch are changed in place, so every map returned during the batch but the
// last must be dropped. A batch ends when its result is published (a Snapshot);
// the next batch must use a new gen.
func (m hamt) setInBatch(key types.NamespacedName, val *serviceEntry, gen uint64) hamt {
	h := m.hash(key)
	root := m.root
	if root == nil {
		root = &hamtNode{gen: gen}
	}
	newRoot, added := setIn(root, 0, h, key, val, gen)
	if added {
		m.size++
	}
	return hamt{root: newRoot, size: m.size, hashFn: m.hashFn}
}

func setIn(n *hamtNode, depth int, h uint64, key types.NamespacedName, val *serviceEntry, gen uint64) (*hamtNode, bool) {
	bit := uint32(1) << slot(h, depth)
	idx := n.index(bit)
	owned := gen != 0 && n.gen == gen
	if n.bitmap&bit == 0 {
		leaf := &hamtLeaf{hash: h, key: key, val: val}
		if owned {
			n.bitmap |= bit
			n.children = slices.Insert(n.children, idx, any(leaf))
			return n, true
		}
		c := &hamtNode{bitmap: n.bitmap | bit, gen: gen, children: make([]any, len(n.children)+1)}
		copy(c.children, n.children[:idx])
		c.children[idx] = leaf
		copy(c.children[idx+1:], n.children[idx:])
		return c, true
	}
	var replacement any
	added := false
	switch child := n.children[idx].(type) {
	case *hamtNode:
		replacement, added = setIn(child, depth+1, h, key, val, gen)
	case *hamtLeaf:
		switch {
		case child.hash == h:
			replacement, added = chainSet(child, key, val)
		case depth+1 >= hamtMaxDepth:
			// Unreachable: different 64-bit hashes differ in some slot above
			// hamtMaxDepth. Kept total (lookups compare keys) rather than panicking.
			replacement, added = &hamtLeaf{hash: child.hash, key: key, val: val, next: child}, true
		default:
			// Split: push the existing leaf one level down, then insert beside it.
			sub := &hamtNode{bitmap: uint32(1) << slot(child.hash, depth+1), gen: gen, children: []any{child}}
			replacement, added = setIn(sub, depth+1, h, key, val, gen)
		}
	}
	if owned {
		n.children[idx] = replacement
		return n, added
	}
	c := &hamtNode{bitmap: n.bitmap, gen: gen, children: make([]any, len(n.children))}
	copy(c.children, n.children)
	c.children[idx] = replacement
	return c, added
}

// del returns a map without key; m is unchanged.
func (m hamt) del(key types.NamespacedName) hamt {
	if m.root == nil {
		return m
	}
	newRoot, removed := delIn(m.root, 0, m.hash(key), key)
	if !removed {
		return m
	}
	if newRoot == nil {
		return hamt{hashFn: m.hashFn}
	}
	return hamt{root: newRoot, size: m.size - 1, hashFn: m.hashFn}
}

// delIn returns the node without key (nil when it became empty) and whether key was present.
func delIn(n *hamtNode, depth int, h uint64, key types.NamespacedName) (*hamtNode, bool) {
	bit := uint32(1) << slot(h, depth)
	if n.bitmap&bit == 0 {
		return n, false
	}
	idx := n.index(bit)
	var replacement any
	switch child := n.children[idx].(type) {
	case *hamtNode:
		sub, removed := delIn(child, depth+1, h, key)
		if !removed {
			return n, false
		}
		if sub != nil {
			// Collapse a node left holding a single leaf.
			if len(sub.children) == 1 {
				if l, ok := sub.children[0].(*hamtLeaf); ok {
					replacement = l
					break
				}
			}
			replacement = sub
		}
	case *hamtLeaf:
		if child.hash != h {
			return n, false
		}
		rest, removed := chainDel(child, key)
		if !removed {
			return n, false
		}
		if rest != nil {
			replacement = rest
		}
	}
	if replacement == nil {
		if len(n.children) == 1 {
			return nil, true
		}
		c := &hamtNode{bitmap: n.bitmap &^ bit, children: make([]any, 0, len(n.children)-1)}
		c.children = append(c.children, n.children[:idx]...)
		c.children = append(c.children, n.children[idx+1:]...)
		return c, true
	}
	c := &hamtNode{bitmap: n.bitmap, children: make([]any, len(n.children))}
	copy(c.children, n.children)
	c.children[idx] = replacement
	return c, true
}

// each calls fn for every entry until fn returns false; the order is the hash order.
func (m hamt) each(fn func(types.NamespacedName, *serviceEntry) bool) bool {
	if m.root == nil {
		return true
	}
	return eachIn(m.root, fn)
}

func eachIn(n *hamtNode, fn func(types.NamespacedName, *serviceEntry) bool) bool {
	for _, c := range n.children {
		switch c := c.(type) {
		case *hamtNode:
			if !eachIn(c, fn) {
				return false
			}
		case *hamtLeaf:
			for l := c; l != nil; l = l.next {
				if !fn(l.key, l.val) {
					return false
				}
			}
		}
	}
	return true
}

// chainSet returns a copy of the chain with key bound to val, and whether key is new.
func chainSet(l *hamtLeaf, key types.NamespacedName, val *serviceEntry) (*hamtLeaf, bool) {
	if l == nil {
		return nil, false
	}
	if l.key == key {
		return &hamtLeaf{hash: l.hash, key: key, val: val, next: l.next}, false
	}
	rest, added := chainSet(l.next, key, val)
	if rest == nil {
		// key is not in the chain: prepend it.
		return &hamtLeaf{hash: l.hash, key: key, val: val, next: l}, true
	}
	return &hamtLeaf{hash: l.hash, key: l.key, val: l.val, next: rest}, added
}

// chainDel returns a copy of the chain without key (nil when it became empty) and
// whether key was present.
func chainDel(l *hamtLeaf, key types.NamespacedName) (*hamtLeaf, bool) {
	if l == nil {
		return nil, false
	}
	if l.key == key {
		return l.next, true
	}
	rest, removed := chainDel(l.next, key)
	if !removed {
		return l, false
	}
	return &hamtLeaf{hash: l.hash, key: l.key, val: l.val, next: rest}, true
}
