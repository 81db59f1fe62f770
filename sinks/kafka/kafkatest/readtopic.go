// Package kafkatest holds test helpers for code that writes to Kafka: read
// a topic back as a consumer outside eventpipe would.
package kafkatest

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadTopic returns every record of topic, partition by partition in
// offset order, read with opts (seed brokers, SASL, isolation level).
// Under read_committed (kgo.FetchIsolationLevel(kgo.ReadCommitted())) it
// reads up to each partition's last stable offset: records of aborted
// transactions and transaction markers are not returned.
func ReadTopic(ctx context.Context, opts []kgo.Opt, topic string) ([]*kgo.Record, error) {
	byPart := map[int32][]*kgo.Record{}
	if err := EachRecord(ctx, opts, topic, func(r *kgo.Record) { byPart[r.Partition] = append(byPart[r.Partition], r) }); err != nil {
		return nil, err
	}
	parts := make([]int32, 0, len(byPart))
	for p := range byPart {
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	var out []*kgo.Record
	for _, p := range parts {
		out = append(out, byPart[p]...)
	}
	return out, nil
}

// EachRecord calls fn with every record of topic that ReadTopic would
// return, in offset order within a partition, without keeping them.
func EachRecord(ctx context.Context, opts []kgo.Opt, topic string, fn func(*kgo.Record)) error {
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	adm.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	// Transaction markers take offsets: kept, they show when the end is
	// reached; they are not returned.
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.KeepControlRecords())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	next := map[int32]int64{}
	behind := func() bool {
		for p, end := range want {
			if next[p] < end {
				return true
			}
		}
		return false
	}
	for behind() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s: %w (read up to %v of %v)", topic, err, next, want)
		}
		fs.EachError(func(_ string, p int32, e error) {
			if err == nil {
				err = fmt.Errorf("fetch partition %d: %w", p, e)
			}
		})
		if err != nil {
			return err
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			// Under read_committed the last stable offset is the end:
			// control records and aborted ones are never returned.
			if p.LastStableOffset > 0 && p.LastStableOffset < want[p.Partition] {
				want[p.Partition] = p.LastStableOffset
			}
			for _, r := range p.Records {
				if !r.Attrs.IsControl() {
					fn(r)
				}
				next[p.Partition] = r.Offset + 1
			}
		})
	}
	return nil
}
