package rules

import (
	"context"
	"fmt"
	"slices"

	"sigs.k8s.io/knftables"
)

// nftVerb is what a transaction does to one object.
type nftVerb int

const (
	verbAdd nftVerb = iota
	verbFlush
	verbDelete
)

func (v nftVerb) String() string { return [...]string{"add", "flush", "delete"}[v] }

// nftOp is one command of a transaction.
type nftOp struct {
	verb nftVerb
	obj  knftables.Object
}

// nftTx is one sync's transaction: the list of commands. The netlink applier
// encodes it; render replays it into a knftables.Transaction for the text payload
// (DryRun, the golden files, the nft CLI applier). Both come from the same list,
// so the text is exactly what the netlink batch carries.
//
// With stream set, the commands are not kept but handed to it as they come (a
// full sync encoded straight into its netlink batch): at 10,000 service ports the
// list and the objects it points to were about 50 MB held beside the batch.
type nftTx struct {
	ops []nftOp
	// n counts the commands, kept or streamed.
	n      int
	stream nftStream
	// err is the stream's first error; later commands are dropped.
	err error
}

// nftStream takes a transaction's commands one by one.
type nftStream interface {
	op(nftOp) error
	// grow makes room for about n more commands.
	grow(n int)
}

func (t *nftTx) put(op nftOp) {
	t.n++
	if t.stream == nil {
		t.ops = append(t.ops, op)
	} else if t.err == nil {
		t.err = t.stream.op(op)
	}
}

func (t *nftTx) add(o knftables.Object)    { t.put(nftOp{verbAdd, o}) }
func (t *nftTx) flush(o knftables.Object)  { t.put(nftOp{verbFlush, o}) }
func (t *nftTx) delete(o knftables.Object) { t.put(nftOp{verbDelete, o}) }

// grow makes room for about n more commands.
func (t *nftTx) grow(n int) {
	if t.stream != nil {
		t.stream.grow(n)
	} else {
		t.ops = slices.Grow(t.ops, n)
	}
}

// render is the transaction as knftables writes it for `nft -f`.
func (t *nftTx) render(nft knftables.Interface) *knftables.Transaction {
	tx := nft.NewTransaction()
	for _, op := range t.ops {
		switch op.verb {
		case verbAdd:
			tx.Add(op.obj)
		case verbFlush:
			tx.Flush(op.obj)
		case verbDelete:
			tx.Delete(op.obj)
		}
	}
	return tx
}

// NFTablesApplier selects how the nftables writer hands a transaction to the kernel.
type NFTablesApplier string

const (
	// NFTablesNetlink encodes the transaction as netlink messages and sends them as
	// one nfnetlink batch: one kernel transaction, without the nft binary and
	// without reading the table back on partial syncs. The default.
	NFTablesNetlink NFTablesApplier = "netlink"
	// NFTablesCLI pipes the text payload to `nft -f -` (through knftables), for
	// hosts whose policy allows the nft binary but not a process's own netlink
	// socket. Each sync costs an nft run that first lists the whole table.
	NFTablesCLI NFTablesApplier = "nft"
)

// nftApplier writes transactions into the kernel and lists what a full sync must
// clean up.
type nftApplier interface {
	// apply runs tx atomically: all of it or none of it.
	apply(ctx context.Context, tx *nftTx) error
	// list returns the names of the table's chains ("chain") or sets ("set");
	// a missing table is an empty list.
	list(ctx context.Context, kind string) ([]string, error)
}

// cliApplier runs transactions through a knftables.Interface: the nft binary, or
// knftables' fake in unit tests.
type cliApplier struct{ nft knftables.Interface }

func (a cliApplier) apply(ctx context.Context, tx *nftTx) error {
	return a.nft.Run(ctx, tx.render(a.nft))
}

func (a cliApplier) list(ctx context.Context, kind string) ([]string, error) {
	names, err := a.nft.List(ctx, kind)
	if knftables.IsNotFound(err) {
		return nil, nil
	}
	return names, err
}

// describeOp names one command for error messages, as the text payload spells it.
func describeOp(op nftOp) string {
	switch o := op.obj.(type) {
	case *knftables.Table:
		return op.verb.String() + " table"
	case *knftables.Chain:
		return fmt.Sprintf("%s chain %s", op.verb, o.Name)
	case *knftables.Rule:
		return fmt.Sprintf("%s rule %s %s", op.verb, o.Chain, o.Rule)
	case *knftables.Set:
		return fmt.Sprintf("%s set %s", op.verb, o.Name)
	case *knftables.Map:
		return fmt.Sprintf("%s map %s", op.verb, o.Name)
	case *knftables.Element:
		return fmt.Sprintf("%s element %s%s { %s }", op.verb, o.Set, o.Map, elementKey(o))
	}
	return fmt.Sprintf("%s %T", op.verb, op.obj)
}
