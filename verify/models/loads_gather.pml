/* The all-gather under braid's Hopper GEMM's loads: each rank's rows sent into its peers' received blocks, their
 * flags, the call stamps and the freed words, across back-to-back calls.
 *
 * Models (file:function):
 *   src/kernels/matmul_sm90.cu: matmul_sm90<T, Variant::kAllGather> (the stamp: the area's call count + 1, read
 *     at the start; the producer: before a step of a peer's piece, wait until its flag holds the stamp, then the
 *     TMA loads)
 *   src/kernels/matmul_sm90_exchange.cuh: finish_exchange (the last block stores the stamp as the call count, then
 *     into every peer's freed word for this rank)
 *   src/kernels/matmul_sm90_loads_gather.cuh: gather_rows (a send: before its first store into a peer's area the
 *     gather warp waits for that peer's freed word to reach stamp - 1; the TMA stores of a piece into the peer's
 *     received block for this rank, bulk_stores_complete (performed), fence, then a release store of the stamp
 *     into the peer's flag for the piece; a copy into the gathered A: wait until the sender's flag holds the
 *     stamp, then the TMA loads of the received piece)
 *   src/overlap/fused_matmul.cpp: FusedMatmulState::reserve_exchange (an area is zeroed when made, on every rank
 *     together, so the counts start equal)
 *
 * Each rank is a process running CALLS calls. One piece a rank: the piece of its own rows it sends to each peer,
 * and the piece it reads from each peer's received block (a load of the producer, or a copy of the gather warp
 * into the gathered A: both wait for the flag, then read); every piece of a block is sent, flagged and read
 * alike, and no piece waits for another. The sends and the reads of a call interleave in any order, as the blocks
 * and warps of a launch do, but one gather warp takes its sends before its copies; the call ends
 * (finish_exchange) once all are done. A call stands for an eager call and for a graph replay alike: the stamp
 * comes from the call count the process keeps, as device memory does.
 *
 * Weak ordering: a TMA store into a peer's received block goes into a pending buffer that the Memory process lands
 * at any time (an older store to a block lands before a newer one: coherence); bulk_stores_complete waits until
 * it has landed; the flag's release store follows. A read's acquire orders its loads after the flag.
 *
 * No reduced widths: the stamps, flags and freed words are 64-bit counts that only grow (rule: flags never repeat),
 * and the model's CALLS calls stay far below any wrap; they are compared as the code compares them (reached:
 * the difference as a signed number, here plain >= since nothing wraps).
 *
 * Properties:
 *   - a rank reads a peer's rows only once the peer's rows of this call have landed (assert in the read);
 *   - no rank stores into a peer's received block while the peer still reads it (assert in the send);
 *   - no deadlock (invalid end states); every rank finishes every call (ltl all_finish, weak fairness).
 *
 * @run real                       safety         pass
 * @run real_progress              ltl:all_finish pass
 * @run MUTANT_NO_FREED_WAIT       safety         assert
 *        the gather warp stores into a peer's area without waiting for its freed word: a rank a call ahead
 *        overwrites rows its peer still reads
 * @run MUTANT_FREED_AT_START      safety         assert
 *        the freed words written when the launch starts instead of when its last block ends: a peer's next call
 *        stores while this rank still reads
 * @run MUTANT_FLAG_BEFORE_DATA    safety         assert
 *        the flag released without waiting for the TMA stores to be performed: a reader loads the rows of the
 *        call before
 * @run MUTANT_STAMP_NOT_STORED    safety         assert
 *        the call count not stored back at the end (a graph replay reuses its stamp): the next call's waits pass
 *        on the previous call's flags
 * @run MUTANT_COPY_BEFORE_SEND    safety         deadlock
 *        the gather warp copies the received pieces into the gathered A before it sends this rank's: every
 *        rank waits for rows no rank has sent
 */

#define RANKS 3     /* at least 3: a rank receives from two peers, one of which may be a call ahead */
#define CALLS 3     /* back-to-back calls (or replays) of every rank */
#define SLOTS 2     /* RANKS - 1: a received block (and a flag) for each peer */

#define peer_of(r, k) (((r) + (k)) % RANKS)
/* The slot of `receiver`'s area that `sender` writes (ExchangeView::slot_of). */
#define slot_of(sender, receiver) (((sender) - (receiver) - 1 + RANKS) % RANKS)
#define at(r, s) ((r) * SLOTS + (s))
#define freed_at(holder, r) ((holder) * RANKS + (r))

byte received[RANKS * SLOTS];   /* r's received block from the peer of slot s, as r reads it: the tag (call + 1) */
byte pending[RANKS * SLOTS];    /* a sender's TMA store into that block that has not landed yet (0: none) */
byte flag[RANKS * SLOTS];       /* r's flag for slot s: the stamp of the sender's last call whose rows landed */
byte freed[RANKS * RANKS];      /* freed[freed_at(s, r)], in s's area: the calls r has finished reading */
byte reading[RANKS * SLOTS];    /* r reads that block now */
byte finished;                  /* ranks done with every call */

/* Lands `sender`'s pending store into `block` (coherence: before a newer one to the same block). */
inline land(block) {
  if :: pending[block] != 0 -> received[block] = pending[block]; pending[block] = 0
     :: else -> skip
  fi
}

/* A send of the gather warp to the peer k places after r: the freed wait, the TMA store, its completion, the
 * flag. */
inline send(r, k, call, stamp) {
  peer = peer_of(r, k);
  block = at(peer, slot_of(r, peer));
#ifndef MUTANT_NO_FREED_WAIT
  freed[freed_at(r, peer)] >= stamp - 1;      /* wait_for_word(freed, stamp - 1): acquire */
#endif
  atomic {
    assert(reading[block] == 0);              /* the peer no longer reads what this store replaces */
    land(block);
    pending[block] = call + 1
  }
#ifndef MUTANT_FLAG_BEFORE_DATA
  pending[block] == 0;                        /* bulk_stores_complete: the store has been performed */
#endif
  flag[block] = stamp                         /* fence.proxy.async, __threadfence_system, st.release.sys */
}

proctype Rank(byte r) {
  byte call = 0, calls = 0, stamp, peer, block;
  bool sent1, sent2, start0, start1, read0, read1;

  do
  :: call < CALLS ->
     stamp = calls + 1;                       /* read by every block at its start */
#ifdef MUTANT_FREED_AT_START
     freed[freed_at(peer_of(r, 1), r)] = stamp;
     freed[freed_at(peer_of(r, 2), r)] = stamp;
#endif
     sent1 = 0; sent2 = 0; start0 = 0; start1 = 0; read0 = 0; read1 = 0;
     do
#ifdef MUTANT_COPY_BEFORE_SEND
     :: !sent1 && read0 && read1 -> send(r, 1, call, stamp); sent1 = 1
     :: !sent2 && read0 && read1 -> send(r, 2, call, stamp); sent2 = 1
#else
     :: !sent1 -> send(r, 1, call, stamp); sent1 = 1
     :: !sent2 -> send(r, 2, call, stamp); sent2 = 1
#endif
     /* a read of slot s's piece (a load, or a copy into the gathered A): wait for its flag (acquire), then read */
     :: !start0 && flag[at(r, 0)] >= stamp ->
        atomic { start0 = 1; reading[at(r, 0)] = 1; assert(received[at(r, 0)] == call + 1) }
     :: !start1 && flag[at(r, 1)] >= stamp ->
        atomic { start1 = 1; reading[at(r, 1)] = 1; assert(received[at(r, 1)] == call + 1) }
     /* the reads take time: a store landing now would change what the loads still read */
     :: start0 && !read0 -> atomic { assert(received[at(r, 0)] == call + 1); reading[at(r, 0)] = 0; read0 = 1 }
     :: start1 && !read1 -> atomic { assert(received[at(r, 1)] == call + 1); reading[at(r, 1)] = 0; read1 = 1 }
     :: sent1 && sent2 && read0 && read1 -> break
     od;
     /* finish_exchange: the last block stores the stamp as the call count, then into the peers' freed words */
#ifndef MUTANT_STAMP_NOT_STORED
     calls = stamp;
#endif
#ifndef MUTANT_FREED_AT_START
     freed[freed_at(peer_of(r, 1), r)] = stamp;
     freed[freed_at(peer_of(r, 2), r)] = stamp;
#endif
     call++
  :: else -> break
  od;
  finished++
}

/* Lands any pending store, in any order, at any time. */
active proctype Memory() {
end:
  do
  :: atomic { pending[0] != 0 -> received[0] = pending[0]; pending[0] = 0 }
  :: atomic { pending[1] != 0 -> received[1] = pending[1]; pending[1] = 0 }
  :: atomic { pending[2] != 0 -> received[2] = pending[2]; pending[2] = 0 }
  :: atomic { pending[3] != 0 -> received[3] = pending[3]; pending[3] = 0 }
  :: atomic { pending[4] != 0 -> received[4] = pending[4]; pending[4] = 0 }
  :: atomic { pending[5] != 0 -> received[5] = pending[5]; pending[5] = 0 }
  od
}

init {
  atomic { run Rank(0); run Rank(1); run Rank(2) }
}

ltl all_finish { <> (finished == RANKS) }
