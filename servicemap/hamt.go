package servicemap

import (
	"hash/maphash"
	"math/bits"

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

type hamtEntry struct {
	key types.NamespacedName
	val *serviceEntry
}

// hamtNode is an inner node: bitmap marks which of the 32 slots are present and
// children holds them in slot order, each a *hamtNode or a *hamtLeaf.
type hamtNode struct {
	bitmap   uint32
	children []any
}

type hamtLeaf struct {
	hash    uint64
	entries []hamtEntry // more than one only on a full 64-bit hash collision
}

type hamt struct {
	root *hamtNode
	size int
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
	h := hashName(key)
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
			for _, e := range c.entries {
				if e.key == key {
					return e.val, true
				}
			}
			return nil, false
		}
	}
}

// set returns a map with key bound to val; m is unchanged.
func (m hamt) set(key types.NamespacedName, val *serviceEntry) hamt {
	h := hashName(key)
	root := m.root
	if root == nil {
		root = &hamtNode{}
	}
	newRoot, added := setIn(root, 0, h, key, val)
	if added {
		m.size++
	}
	return hamt{root: newRoot, size: m.size}
}

func setIn(n *hamtNode, depth int, h uint64, key types.NamespacedName, val *serviceEntry) (*hamtNode, bool) {
	bit := uint32(1) << slot(h, depth)
	idx := n.index(bit)
	if n.bitmap&bit == 0 {
		c := &hamtNode{bitmap: n.bitmap | bit, children: make([]any, len(n.children)+1)}
		copy(c.children, n.children[:idx])
		c.children[idx] = &hamtLeaf{hash: h, entries: []hamtEntry{{key, val}}}
		copy(c.children[idx+1:], n.children[idx:])
		return c, true
	}
	var replacement any
	added := false
	switch child := n.children[idx].(type) {
	case *hamtNode:
		replacement, added = setIn(child, depth+1, h, key, val)
	case *hamtLeaf:
		switch {
		case child.hash == h:
			l := &hamtLeaf{hash: h, entries: make([]hamtEntry, 0, len(child.entries)+1)}
			found := false
			for _, e := range child.entries {
				if e.key == key {
					e.val = val
					found = true
				}
				l.entries = append(l.entries, e)
			}
			if !found {
				l.entries = append(l.entries, hamtEntry{key, val})
				added = true
			}
			replacement = l
		case depth+1 >= hamtMaxDepth:
			// Unreachable: different 64-bit hashes differ in some slot above
			// hamtMaxDepth. Kept total (lookups compare keys) rather than panicking.
			l := &hamtLeaf{hash: child.hash, entries: append(append([]hamtEntry(nil), child.entries...), hamtEntry{key, val})}
			replacement, added = l, true
		default:
			// Split: push the existing leaf one level down, then insert beside it.
			sub := &hamtNode{bitmap: uint32(1) << slot(child.hash, depth+1), children: []any{child}}
			replacement, added = setIn(sub, depth+1, h, key, val)
		}
	}
	c := &hamtNode{bitmap: n.bitmap, children: make([]any, len(n.children))}
	copy(c.children, n.children)
	c.children[idx] = replacement
	return c, added
}

// del returns a map without key; m is unchanged.
func (m hamt) del(key types.NamespacedName) hamt {
	if m.root == nil {
		return m
	}
	newRoot, removed := delIn(m.root, 0, hashName(key), key)
	if !removed {
		return m
	}
	if newRoot == nil {
		return hamt{}
	}
	return hamt{root: newRoot, size: m.size - 1}
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
		kept := make([]hamtEntry, 0, len(child.entries))
		for _, e := range child.entries {
			if e.key != key {
				kept = append(kept, e)
			}
		}
		if len(kept) == len(child.entries) {
			return n, false
		}
		if len(kept) > 0 {
			replacement = &hamtLeaf{hash: h, entries: kept}
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
			for _, e := range c.entries {
				if !fn(e.key, e.val) {
					return false
				}
			}
		}
	}
	return true
}
