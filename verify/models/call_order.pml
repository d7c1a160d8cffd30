/* The order of a communicator's calls across streams, graph captures and graph replays (DESIGN rule 8).
 *
 * Models (file:function):
 *   src/sync/call_order.cpp: CallOrder::begin, begin_eager, begin_captured, end, end_captured,
 *     move_record_node, find_chain, start_chain, forget_ended_captures (NOTE [a chain per capture] in
 *     call_order.hpp: each capture keeps its own chain, found by its capture id)
 *   CUDA's semantics that the rule rests on, as the model takes them:
 *     - work on one stream runs in order; cudaStreamWaitEvent orders the stream's later work after the event's
 *       latest record as of the wait; cudaEventRecord records after the stream's work so far;
 *     - stream capture: a captured stream holds a set of graph nodes that its next node depends on; a fork
 *       (an event recorded on a captured stream, waited on by another) gives the other stream the same set;
 *       cudaStreamUpdateCaptureDependencies(add) adds nodes to the set; an event-wait node with
 *       cudaEventWaitExternal waits, in each replay, for the event's latest record as of the replay's launch;
 *       an event-record node records the event, in each replay, after the nodes it depends on, in the order of
 *       launches;
 *     - a graph launched on a stream runs after the stream's earlier work, and the stream's later work runs
 *       after the whole graph.
 *
 * One process, the host thread that drives the communicator (NCCL's rule: one at a time), makes up to OPS
 * operations in any order the API allows: an eager call on a stream, a captured call on a captured stream,
 * begin a capture on a stream, fork a stream into an open capture, end a capture, launch a captured graph (any
 * number of times, on any stream). The GPU is the dependency graph these build: each call that runs on the GPU
 * (an eager call, or a captured call in one replay) is an instance, numbered in the order the calls reach the
 * GPU (a replay's calls in their capture order, at its launch). An instance's ancestors are kept as a bit mask
 * of instances (closed under ancestry); instance k may start before instance j < k has finished exactly when j
 * is not among its ancestors, as the GPU runs independent work at once.
 *
 * Properties:
 *   - every instance has every instance issued before it among its ancestors: calls run one after the other,
 *     in the order they reach the GPU (assert in issue);
 *   - a graph holds one event-record node (assert in end_captured).
 *
 * NOTE [reduced sizes]
 *   kMaxCaptureChains is 64; here MAX_CHAINS is CAPTURES (2), so no chain is pushed out, as in the real code
 *   while fewer than 64 other captures begin between two calls of a capture. The run documented_chain_bound
 *   sets MAX_CHAINS to 1 and shows the loss call_order.hpp documents past the bound (a counterexample expected).
 *   STREAMS 3, CAPTURES 2 and OPS 7 are the smallest that hold the shapes of tests/gpu/test_capture_order.cpp
 *   (a capture forked into two streams, a call on each, an eager call or another capture's call between, the
 *   end, a launch); every program of up to OPS operations is explored, not only those shapes.
 *
 * @run real                          safety  pass
 * @run documented_chain_bound        safety  assert -DMAX_CHAINS=1
 * @run MUTANT_SINGLE_CHAIN           safety  assert
 *        one chain for the communicator (the last call's capture id): an eager call between two calls of a
 *        capture makes the second one look like a capture's first, with no edge from the first
 * @run MUTANT_NO_EXTERNAL_WAIT       safety  assert
 *        a capture's first call does not wait on the last eager work: a replay runs beside earlier calls
 * @run MUTANT_NO_RECORD_NODE         safety  assert
 *        no event-record node: an eager call after a launch runs beside the replay
 * @run MUTANT_RECORD_STAYS_AT_FIRST  safety  assert
 *        the record node is not moved to the latest call: it records after the capture's first call only
 * @run MUTANT_EAGER_WAITS_ONLY_ACROSS_STREAMS safety assert
 *        an eager call waits only when its stream differs from the last eager call's, ignoring replays
 * @run MUTANT_FORGET_ANY_OTHER_CAPTURE safety assert
 *        forget_ended_captures drops every chain of another capture than the call's, whatever the stream
 */

#define STREAMS 3
#define CAPTURES 2              /* capture ids 1 .. CAPTURES */
#define NODES 4                 /* captured calls a capture holds at most */
#define OPS 7                   /* host operations */
#ifndef MAX_CHAINS
#define MAX_CHAINS 2            /* reduced from kMaxCaptureChains = 64: NOTE [reduced sizes] */
#endif
#define NONE 255
#define EXT 128                 /* a node-set bit: depends on the capture's external wait on eager_done */
#define bit(i) (1 << (i))

/* The GPU: masks of instances (bit k: the k-th call to reach the GPU). */
int tail[STREAMS];              /* what a stream's next work follows */
int eager_recorded;             /* what eager_done's latest record follows */
int issued;                     /* every instance so far */
byte instances;

/* Captures, as the host sees them while capturing. Node sets: bit j = the capture's j-th call node, EXT. */
byte capture_of[STREAMS];       /* 0: not capturing; else the capture id */
byte capture_deps[STREAMS];     /* the node set a captured stream's next node depends on (closed under ancestry) */
byte capture_state[CAPTURES + 1];   /* 0: not begun, 1: open, 2: ended */
byte nodes[CAPTURES + 1];       /* call nodes captured so far */
byte node_deps[(CAPTURES + 1) * NODES];   /* each call node's ancestors (closed) */
byte record_deps[CAPTURES + 1]; /* the record node's ancestors (closed) */
byte record_nodes[CAPTURES + 1];

/* CallOrder's state. */
bool graphs_made;
byte last_eager_stream = NONE;
byte chain_capture[MAX_CHAINS];     /* 0: free slot */
byte chain_last_stream[MAX_CHAINS];
byte chain_last_end[MAX_CHAINS];    /* the node set that ends the capture's latest call; 0: none yet */
byte chain_last_call[MAX_CHAINS];   /* calls_ at the chain's latest call: the oldest is pushed out first */
bool chain_recorded[MAX_CHAINS];    /* the chain made its capture's record node */
byte calls;                         /* captured calls begun so far */

/* An instance reaches the GPU after everything in `ancestors`: it must follow every instance before it. */
inline issue(ancestors) {
  assert((ancestors & issued) == issued);
  issued = issued | bit(instances);
  instances++
}

/* CallOrder::forget_ended_captures: a stream outside a chain's capture shows that capture ended. */
inline forget_ended_captures(s, id) {
  c = 0;
  do
  :: c < MAX_CHAINS ->
#ifdef MUTANT_FORGET_ANY_OTHER_CAPTURE
     if :: chain_capture[c] != 0 && chain_capture[c] != id -> chain_capture[c] = 0 :: else -> skip fi;
#else
     if :: chain_capture[c] != 0 && chain_last_stream[c] == s && chain_capture[c] != id -> chain_capture[c] = 0
        :: else -> skip
     fi;
#endif
     c++
  :: else -> c = 0; break
  od
}

/* CallOrder::find_chain: the slot of capture `id`'s chain, or NONE. */
inline find_chain(id) {
  chain = NONE; c = 0;
  do
  :: c < MAX_CHAINS -> if :: chain_capture[c] == id -> chain = c :: else -> skip fi; c++
  :: else -> c = 0; break
  od
}

/* CallOrder::start_chain: a free slot, or the one whose latest call is the oldest. */
inline start_chain(id) {
  chain = NONE; c = 0;
  do
  :: c < MAX_CHAINS ->
     if :: chain == NONE && chain_capture[c] == 0 -> chain = c :: else -> skip fi; c++
  :: else -> c = 0; break
  od;
  if
  :: chain == NONE ->
     chain = 0; c = 1;
     do
     :: c < MAX_CHAINS -> if :: chain_last_call[c] < chain_last_call[chain] -> chain = c :: else -> skip fi; c++
     :: else -> c = 0; break
     od
  :: else -> skip
  fi;
  chain_capture[chain] = id; chain_last_stream[chain] = NONE; chain_last_end[chain] = 0;
  chain_recorded[chain] = false; chain_last_call[chain] = calls
}

/* An eager call on stream s: begin (begin_eager), its kernel, end (eager_done recorded after it). */
inline eager_call(s) {
  forget_ended_captures(s, 0);
#ifdef MUTANT_EAGER_WAITS_ONLY_ACROSS_STREAMS
  if :: last_eager_stream != NONE && last_eager_stream != s -> tail[s] = tail[s] | eager_recorded
#else
  if :: graphs_made || (last_eager_stream != NONE && last_eager_stream != s) -> tail[s] = tail[s] | eager_recorded
#endif
     :: else -> skip
  fi;
  issue(tail[s]);
  tail[s] = tail[s] | bit(instances - 1);
  eager_recorded = tail[s];
  last_eager_stream = s;
#ifdef MUTANT_SINGLE_CHAIN
  last_capture = 0; last_stream = s
#else
  skip
#endif
}

#ifndef MUTANT_SINGLE_CHAIN
/* A captured call on stream s, in capture id = capture_of[s]: begin_captured, its node, end_captured. */
inline captured_call(s) {
  id = capture_of[s];
  forget_ended_captures(s, id);
  find_chain(id);
  if
  :: chain == NONE ->
#ifndef MUTANT_NO_EXTERNAL_WAIT
     capture_deps[s] = capture_deps[s] | EXT;   /* the external event-wait node on eager_done */
#endif
     start_chain(id)
  :: chain != NONE && chain_last_stream[chain] != s && chain_last_end[chain] != 0 ->
     capture_deps[s] = capture_deps[s] | chain_last_end[chain]   /* edges from the previous call's end */
  :: else -> skip
  fi;
  calls++;
  chain_last_call[chain] = calls;
  add_call_node(s);
  /* end_captured */
  graphs_made = true;
  find_chain(id);
  if :: chain == NONE -> start_chain(id) :: else -> skip fi;   /* pushed out since begin */
  move_record_node(s);
  chain_last_stream[chain] = s;
  chain_last_end[chain] = capture_deps[s]
}
#else
/* The rule before chains per capture: one captured_done event and one last_capture id for the communicator. */
inline captured_call(s) {
  id = capture_of[s];
  if
  :: id != last_capture ->
     capture_deps[s] = capture_deps[s] | EXT;
     single_record_made = false
  :: id == last_capture && last_stream != s -> capture_deps[s] = capture_deps[s] | captured_done
  :: else -> skip
  fi;
  add_call_node(s);
  graphs_made = true;
  captured_done = capture_deps[s];
  if :: !single_record_made -> record_nodes[id]++; single_record_made = true :: else -> skip fi;
  record_deps[id] = capture_deps[s];
  last_stream = s;
  last_capture = id
}
#endif

/* The call's node (its kernels), after the stream's node set. */
inline add_call_node(s) {
  node_deps[capture_of[s] * NODES + nodes[capture_of[s]]] = capture_deps[s];
  capture_deps[s] = capture_deps[s] | bit(nodes[capture_of[s]]);
  nodes[capture_of[s]]++
}

/* CallOrder::move_record_node: one record node a capture, after the end of its latest call. */
inline move_record_node(s) {
  if
  :: !chain_recorded[chain] ->
     chain_recorded[chain] = true;
     record_nodes[id]++;
     assert(record_nodes[id] == 1);   /* one record node a graph */
     record_deps[id] = capture_deps[s]
  :: else ->
#ifndef MUTANT_RECORD_STAYS_AT_FIRST
     record_deps[id] = capture_deps[s]
#else
     skip
#endif
  fi
}

/* A replay of capture id's graph launched on stream s: its calls reach the GPU in capture order. */
inline launch_graph(id, s) {
  external = eager_recorded;   /* the external wait node: eager_done's latest record as of the launch */
  j = 0;
  do
  :: j < nodes[id] ->
     ancestors = tail[s];
     if :: node_deps[id * NODES + j] & EXT -> ancestors = ancestors | external :: else -> skip fi;
     i = 0;
     do
     :: i < j -> if :: node_deps[id * NODES + j] & bit(i) -> ancestors = ancestors | replayed[i] :: else -> skip fi; i++
     :: else -> break
     od;
     issue(ancestors);
     replayed[j] = ancestors | bit(instances - 1);
     j++
  :: else -> break
  od;
  /* the record node records eager_done after the nodes it depends on */
  ancestors = tail[s];
  if :: record_deps[id] & EXT -> ancestors = ancestors | external :: else -> skip fi;
  i = 0;
  do
  :: i < nodes[id] -> if :: record_deps[id] & bit(i) -> ancestors = ancestors | replayed[i] :: else -> skip fi; i++
  :: else -> break
  od;
#ifndef MUTANT_NO_RECORD_NODE
  if :: record_nodes[id] > 0 -> eager_recorded = ancestors :: else -> skip fi;
#endif
  /* the stream's later work follows the whole graph */
  i = 0;
  do
  :: i < nodes[id] -> tail[s] = tail[s] | replayed[i]; i++
  :: else -> break
  od;
  if :: nodes[id] > 0 -> tail[s] = tail[s] | external :: else -> skip fi;
  i = 0; j = 0; ancestors = 0; external = 0;
  do :: i < NODES -> replayed[i] = 0; i++ :: else -> i = 0; break od
}

#define not_capturing(s) (capture_of[s] == 0)
#define capturing(s) (capture_of[s] != 0)
#define next_capture (capture_state[1] == 0 -> 1 : (capture_state[2] == 0 -> 2 : 0))
#define may_call(s) (capturing(s) && nodes[capture_of[s]] < NODES)

/* The host: any operation the API allows, OPS of them. */
active proctype Host() {
  byte op = 0, s, t, c, chain, id, i, j;
  int ancestors, external;
  int replayed[NODES];
#ifdef MUTANT_SINGLE_CHAIN
  byte last_capture = 0, last_stream = NONE, captured_done = 0;
  bool single_record_made;
#endif
  do
  :: op < OPS ->
     if
     :: s = 0 :: s = 1 :: s = 2
     fi;
     if
     :: atomic { not_capturing(s) -> eager_call(s) }
     :: atomic { may_call(s) -> captured_call(s) }
     :: atomic { not_capturing(s) && next_capture != 0 ->   /* cudaStreamBeginCapture on s */
                 c = next_capture; capture_state[c] = 1; capture_of[s] = c; capture_deps[s] = 0; c = 0 }
     :: atomic { not_capturing(s) && capturing((s + 1) % STREAMS) ->   /* fork s from a captured stream */
                 capture_of[s] = capture_of[(s + 1) % STREAMS]; capture_deps[s] = capture_deps[(s + 1) % STREAMS] }
     :: atomic { not_capturing(s) && capturing((s + 2) % STREAMS) ->
                 capture_of[s] = capture_of[(s + 2) % STREAMS]; capture_deps[s] = capture_deps[(s + 2) % STREAMS] }
     :: atomic { capturing(s) ->                            /* cudaStreamEndCapture (its streams joined) */
                 c = capture_of[s]; capture_state[c] = 2;
                 t = 0;
                 do :: t < STREAMS -> if :: capture_of[t] == c -> capture_of[t] = 0 :: else -> skip fi; t++
                    :: else -> t = 0; break
                 od;
                 c = 0 }
     :: atomic { not_capturing(s) && capture_state[1] == 2 -> launch_graph(1, s) }
     :: atomic { not_capturing(s) && capture_state[2] == 2 -> launch_graph(2, s) }
     fi;
     atomic { op++; s = 0 }
  :: else -> break
  od
}
