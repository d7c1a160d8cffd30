// Inputs and the host reference for checking a collective's output (braid-bench's #wrong column; written so
// GPU tests can reuse it).
//
// Every element of every rank's input is a pure function of (seed, rank, index, type, op): any rank
// regenerates any other rank's input on the host, so the reference needs no data copied between ranks, and
// the check streams over the output in chunks (memory stays bounded at any size). Values are never zero:
//   signed ints   ±[1, 8] (prod: ±{1, 2})      unsigned ints  [1, 8] (prod: {1, 2})
//   floats        ±[1/16, 1) (prod: [0.5, 1.5)), with no more significand bits than the type has, so the
//                 inputs are exact in it and the reference folds exactly what the GPU gets
// The ranges keep small sums exact, and keep every reachable result away from the poison pattern
// (poison_byte), so an element the collective never wrote is always counted wrong.
//
// Integers compare exactly, with sums and products wrapping (computed in the unsigned type of the same
// width). Floats compare within a relative tolerance of the magnitude the result is built from: for sum and
// avg the sum of |inputs| (a sum that cancels to ~0 still gets a meaningful bound), for prod |product|;
// max and min are selections and compare exactly. avg is sum / ranks (integers: the wrapped sum divided
// toward zero, as NCCL does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "braid/types.hpp"
#include "collective.hpp"

namespace braid::bench {

// What every rank's input is made of.
struct DataSpec {
  uint64_t seed = 0;  // shared by all ranks
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // picks the value range (prod needs values near 1)
};

// Writes elements [first, first + count) of `rank`'s input, in the type's bytes, to `out`.
void generate_input(const DataSpec& data, int rank, size_t first, size_t count, void* out);

// A byte whose repetition no reachable result equals: 0xFF for floats (NaN) and unsigned ints (the maximum),
// 0x7F for signed ints (the maximum). Fill outputs with it before a checked call.
unsigned char poison_byte(DataType type);

// Relative tolerance for floats with `ranks` contributions (0 for integers: exact).
double tolerance(DataType type, int ranks);

// One rank's view of one collective call.
struct CheckSpec {
  Collective coll = Collective::kAllReduce;
  DataSpec data;
  int ranks = 1;
  int rank = 0;
  int root = 0;
  Shape shape;  // from shape_of(coll, bytes, type, ranks, rank)
};

// False where this rank's output is undefined (reduce on a rank other than the root).
bool output_defined(const CheckSpec& check);

struct Mismatch {
  uint64_t wrong = 0;         // elements outside the tolerance (or unequal, for integers)
  size_t first_index = 0;     // output element index of the first wrong one (valid when wrong > 0)
  std::string expected, got;  // their values, printed
};

// Compares output elements [first, first + count) of this rank, a host copy at `got`, with the reference;
// adds to `result`. Throws std::invalid_argument for an unsupported (type, op).
void compare_output(const CheckSpec& check, size_t first, size_t count, const void* got, Mismatch& result);

}  // namespace braid::bench
