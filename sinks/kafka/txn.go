package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eventpipe/eventpipe/sinks"
)

var _ sinks.Transactor = (*Sink)(nil)

// Transactional implements sinks.Transactor: a producer of its own for one
// source partition, with the partition's transactional.id, whose Push
// writes the batch and commits the consumer group's offset after it in one
// transaction (Kafka's consume-transform-produce). A read_committed reader
// of the sink's topic then sees every record once even when the partition's
// owner is killed after producing and before committing: that transaction
// is aborted (by the next owner's Init, or by the timeout) and the next
// owner starts from the offset committed with the last transaction that
// did commit.
func (s *Sink) Transactional(src sinks.TxnSource) (sinks.TxnPusher, error) {
	if src.TransactionalID == "" || src.Group == "" || src.Topic == "" || src.Member == nil {
		return nil, errors.New("kafka sink: transactional pusher needs a transactional id, a group, a topic and the group member")
	}
	opts := append(slices.Clip(s.opts), s.cfg.producerOptions()...)
	opts = append(opts, kgo.TransactionalID(src.TransactionalID), kgo.WithLogger(kgoLogger{s.log}))
	if src.Timeout > 0 {
		opts = append(opts, kgo.TransactionTimeout(src.Timeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka sink: transactional producer %s: %w", src.TransactionalID, err)
	}
	return &txnPusher{s: s, cl: cl, src: src,
		enc: encoder{format: s.cfg.ValueFormat, source: s.cfg.Source, maxBytes: s.cfg.MaxMessageBytes}}, nil
}

// txnPusher is one partition's transactional producer. Its pushes are
// serialised (one runner per partition) and independent of other
// partitions'.
type txnPusher struct {
	s   *Sink
	cl  *kgo.Client
	src sinks.TxnSource

	mu      sync.Mutex
	enc     encoder
	topicID [16]byte // the source topic's id: newer TxnOffsetCommit versions name topics by id
}

// Init registers the transactional id with the brokers
// (InitProducerId): a previous producer with the same id is fenced, and a
// transaction it left open is aborted before this returns.
func (t *txnPusher) Init(ctx context.Context) error {
	if _, _, err := t.cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("init transactional producer %s: %w", t.src.TransactionalID, err)
	}
	td, err := kadm.NewClient(t.cl).ListTopics(ctx, t.src.Topic)
	if err == nil {
		err = td.Error()
	}
	if err != nil {
		return fmt.Errorf("look up source topic %s: %w", t.src.Topic, err)
	}
	t.mu.Lock()
	t.topicID = td[t.src.Topic].ID
	t.mu.Unlock()
	return nil
}

// Close releases the producer; an open transaction is aborted by the
// brokers (or by the partition's next owner).
func (t *txnPusher) Close() { t.cl.Close() }

// Push implements sinks.Pusher. A batch whose records were all refused for
// good produces nothing and commits nothing here: the runner's own cursor
// commit moves the group's offset past it, as for filtered records.
func (t *txnPusher) Push(ctx context.Context, batch []sinks.Record) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	after := batch[len(batch)-1].Offset
	return t.s.push(ctx, t.cl, &t.enc, batch, func(recs []*kgo.Record, idx []int, failed map[int]error) error {
		for len(recs) > 0 {
			refused, err := t.produceAndCommit(ctx, recs, idx, failed, after)
			if len(refused) == 0 {
				return err
			}
			// The transaction was aborted; the refused records are named
			// in failed: the others go again, in a new transaction.
			keep := recs[:0:0]
			keepIdx := idx[:0:0]
			for j := range recs {
				if !slices.Contains(refused, j) {
					keep, keepIdx = append(keep, recs[j]), append(keepIdx, idx[j])
				}
			}
			recs, idx = keep, keepIdx
		}
		return nil
	})
}

// produceAndCommit runs one transaction: the records, then the group
// offset after (Kafka offset), then the commit. Any failure aborts it.
// Records the broker refuses for good (a permanent error naming them) are
// added to failed and returned as refused (indexes into recs): the
// transaction was aborted and must be run again without them.
func (t *txnPusher) produceAndCommit(ctx context.Context, recs []*kgo.Record, idx []int, failed map[int]error, after uint64) (refused []int, err error) {
	if err := t.cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	defer func() {
		if err == nil && len(refused) == 0 {
			return
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.WriteTimeout)
		defer cancel()
		if aerr := t.cl.AbortBufferedRecords(actx); aerr != nil {
			t.s.log.Warn("kafka sink: aborting buffered records failed", "err", aerr)
		}
		if eerr := t.cl.EndTransaction(actx, kgo.TryAbort); eerr != nil {
			t.s.log.Warn("kafka sink: abort failed; the brokers abort the transaction after its timeout", "err", eerr)
		}
	}()
	res := t.cl.ProduceSync(ctx, recs...)
	if perr := res.FirstErr(); perr != nil {
		var retry error
		for j, r := range res {
			switch e := r.Err; {
			case e == nil:
			case permanent(e):
				refused = append(refused, j)
			case retry == nil:
				retry = e
			}
		}
		switch {
		case retry != nil:
			if errors.Is(retry, kerr.UnknownTopicOrPartition) {
				return nil, t.s.topicNotFound(len(recs), retry)
			}
			return nil, classify(fmt.Errorf("produce in transaction: %w", retry))
		case len(refused) == 1 || len(refused) < len(recs):
			for _, j := range refused {
				failed[idx[j]] = fmt.Errorf("refused by the broker: %w", res[j].Err)
			}
			return refused, nil
		default:
			// The broker refused a whole batch of several records as too
			// large: which one is too large on its own is not known.
			return nil, fmt.Errorf("produce in transaction: the broker refused %d records (is the topic's max.message.bytes below max_message_bytes %d?): %w",
				len(recs), t.s.cfg.MaxMessageBytes, perr)
		}
	}
	if err := t.commitOffset(ctx, int64(after)); err != nil {
		return nil, err
	}
	if err := t.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return nil, fmt.Errorf("commit transaction: %w", err)
	}
	t.s.countBytes(recs)
	t.s.topicFound()
	if t.src.Committed != nil {
		t.src.Committed(after)
	}
	return nil, nil
}

// commitOffset adds the group's offset to the open transaction
// (AddOffsetsToTxn, then TxnOffsetCommit under the member's generation,
// so a member the group removed cannot commit).
func (t *txnPusher) commitOffset(ctx context.Context, off int64) error {
	id, epoch, err := t.cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("producer id: %w", err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = t.src.TransactionalID, id, epoch, t.src.Group
	aresp, err := add.RequestWith(ctx, t.cl)
	if err == nil {
		err = kerr.ErrorForCode(aresp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("add offsets of group %s to the transaction: %w", t.src.Group, err)
	}
	member, gen := t.src.Member()
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = t.src.TransactionalID, t.src.Group, id, epoch
	req.MemberID, req.Generation = member, gen
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = t.src.Topic, t.topicID
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = t.src.Partition, off, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, t.cl)
	if err != nil {
		return fmt.Errorf("commit offset %d of %s/%d in the transaction: %w", off, t.src.Topic, t.src.Partition, err)
	}
	for _, tt := range resp.Topics {
		for _, p := range tt.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("commit offset %d of %s/%d in the transaction: %w", off, t.src.Topic, t.src.Partition, err)
			}
		}
	}
	return nil
}
