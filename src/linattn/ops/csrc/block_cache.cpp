// The block cache of block_cache.h: mmap'ed blocks on 2 MiB pages, kept for the next tensor.

#include "block_cache.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/accumulate.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tuning.h"

namespace linattn_native {

#if defined(__linux__) && defined(MADV_HUGEPAGE)
namespace {

// A cache of the large blocks of memory the kernels' outputs live in (as PyTorch's CUDA caching
// allocator keeps GPU memory). Memory that goes back to the system comes back zeroed by the kernel
// at its first touch, a noticeable share of a long forward pass that writes a fresh output. A
// block freed by its tensor is kept here, up
// to LINATTN_CACHE_MIB in all (default kCacheMib, tuning.h; 0 keeps nothing), and serves the next
// output of the same size (training repeats its sizes every step). A request that finds no block
// of its size first returns every kept block to the system, so that the cache never adds to a
// peak of memory; ``cache_release`` empties it. Blocks are mapped on 2 MiB boundaries and backed
// by 2 MiB pages where the kernel allows it (transparent huge pages in "madvise" mode): the first
// touch of a fresh large tensor then faults in 512 times fewer pages.
class BlockCache {
 public:
  static constexpr size_t kHuge = size_t{1} << 21;
  static constexpr size_t kMinBytes = kHugeMinBytes;  // smaller tensors: PyTorch's allocator

  struct Block {
    void* base;     // the mapping
    size_t mapped;  // its length
    void* data;     // its first 2 MiB boundary
    size_t bytes;   // the usable length from data: a multiple of 2 MiB
  };

  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;  // never destroyed: tensors may outlive exit
    return *cache;
  }

  // A block of at least ``nbytes`` (rounded up to 2 MiB), or nullptr if the mapping fails.
  Block* take(size_t nbytes);

  // Keep a block freed by its tensor (within the limit), or return it to the system.
  void give(Block* block);

  // Return every kept block to the system; the bytes returned.
  int64_t release();

  int64_t kept_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(kept_bytes_);
  }

 private:
  static size_t limit() {
    const char* text = std::getenv("LINATTN_CACHE_MIB");
    const long long mib = text != nullptr ? std::atoll(text) : kCacheMib;
    return mib > 0 ? static_cast<size_t>(mib) << 20 : 0;
  }

  static void unmap(Block* block) {
    munmap(block->base, block->mapped);
    delete block;
  }

  std::mutex mutex_;
  std::vector<Block*> kept_;
  size_t kept_bytes_ = 0;
};

// A block of at least ``nbytes`` (rounded up to 2 MiB), or nullptr if the mapping fails.
BlockCache::Block* BlockCache::take(size_t nbytes) {
  const size_t bytes = (nbytes + kHuge - 1) / kHuge * kHuge;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i]->bytes == bytes) {
        Block* block = kept_[i];
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
        kept_bytes_ -= bytes;
        return block;
      }
    }
  }
  release();  // no block of this size: the others go back before new memory is mapped
  const size_t mapped = bytes + kHuge;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  const uintptr_t first = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1);
  void* data = reinterpret_cast<void*>(first);
  madvise(data, bytes, MADV_HUGEPAGE);
  return new Block{base, mapped, data, bytes};
}

// Keep a block freed by its tensor (within the limit), or return it to the system.
void BlockCache::give(Block* block) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_bytes_ + block->bytes <= limit()) {
      kept_.push_back(block);
      kept_bytes_ += block->bytes;
      return;
    }
  }
  unmap(block);
}

// Return every kept block to the system; the bytes returned.
int64_t BlockCache::release() {
  std::vector<Block*> blocks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(kept_);
    kept_bytes_ = 0;
  }
  int64_t bytes = 0;
  for (Block* block : blocks) {
    bytes += static_cast<int64_t>(block->bytes);
    unmap(block);
  }
  return bytes;
}

void give_back(void* block) {
  BlockCache::instance().give(static_cast<BlockCache::Block*>(block));
}

}  // namespace

// An uninitialised tensor; from kHugeMinBytes up, in a block of ``BlockCache``. Its storage stays
// resizable (a resize moves it to PyTorch's allocator and gives the block back).
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t nbytes =
      static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  BlockCache::Block* block =
      nbytes >= BlockCache::kMinBytes ? BlockCache::instance().take(nbytes) : nullptr;
  if (block == nullptr) return at::empty(sizes, options);
  c10::DataPtr data(block->data, block, &give_back, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes),
                       std::move(data), c10::GetCPUAllocator(), /*resizable=*/true);
  return at::empty({0}, options).set_(storage, 0, sizes);
}

int64_t cache_release() { return BlockCache::instance().release(); }
int64_t cache_bytes() { return BlockCache::instance().kept_bytes(); }
#else
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options);
}
int64_t cache_release() { return 0; }
int64_t cache_bytes() { return 0; }
#endif

// ``fresh`` for Python: an uninitialised CPU tensor of ``sizes``, on huge pages where possible.
at::Tensor empty_huge(at::IntArrayRef sizes, at::ScalarType dtype) {
  uint64_t bytes = c10::elementSize(dtype);
  for (const int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "linattn_native.empty_huge: sizes must be >= 0, got ", sizes);
    TORCH_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(n), &bytes) &&
                    bytes <= static_cast<uint64_t>(INT64_MAX),
                "linattn_native.empty_huge: sizes ", sizes, " overflow 64 bits");
  }
  return fresh(sizes, at::TensorOptions().dtype(dtype));
}

}  // namespace linattn_native
