#include "data/preprocess.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/chunked_encoding.h"
#include "data/indexed_dataset.h"

namespace nf::data {
namespace {

// Under 65,500 tokens the ids fit u16 (Megatron's rule, leaving room for special tokens).
constexpr int64_t kU16VocabLimit = 65500;

// Where a document comes from: options.inputs[input], its `ordinal`-th document (from 1).
struct Origin {
  size_t input;
  int64_t ordinal;
};

struct Batch {
  int64_t id = 0;
  std::vector<std::string> documents;
  std::vector<Origin> origins;               // of each document
  std::vector<std::vector<int32_t>> tokens;  // filled by a worker
  std::vector<size_t> inexactly_cut;         // the documents cut inexactly, by the worker
  absl::Status status;
};

// Batches flow reader -> workers (pending) -> writer (done, reordered by id).
class BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}

  // Blocks while `capacity` batches are in flight (queued, being encoded, or done but not
  // yet written): this bound is what keeps memory flat for any corpus size.
  void Push(Batch batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock, [&] { return in_flight_ < capacity_; });
    ++in_flight_;
    batch.id = pushed_++;
    pending_.push_back(std::move(batch));
    work_.notify_one();
  }
  // The reader is done: no more batches.
  void Close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    work_.notify_all();
    ready_.notify_all();
  }
  // A batch to encode, or false when the reader is done and nothing is pending.
  bool Take(Batch& batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    work_.wait(lock, [&] { return closed_ || !pending_.empty(); });
    if (pending_.empty()) return false;
    batch = std::move(pending_.front());
    pending_.pop_front();
    return true;
  }
  void Done(Batch batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.emplace(batch.id, std::move(batch));
    ready_.notify_one();
  }
  // The next batch in input order once encoded; nullopt after the last one.
  std::optional<Batch> NextInOrder() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return done_.count(next_) > 0 || (closed_ && next_ >= pushed_); });
    if (done_.count(next_) == 0) return std::nullopt;
    Batch batch = std::move(done_.at(next_));
    done_.erase(next_++);
    --in_flight_;
    space_.notify_one();
    return batch;
  }

 private:
  std::mutex mutex_;
  std::condition_variable space_, work_, ready_;
  std::deque<Batch> pending_;
  std::map<int64_t, Batch> done_;
  size_t capacity_;
  size_t in_flight_ = 0;
  int64_t pushed_ = 0;  // ids handed out
  int64_t next_ = 0;    // the next id to write
  bool closed_ = false;
};

// The document's ids, encoded in chunks of kDefaultMaxChunkBytes at most so that a tokenizer's
// per-call memory stays bounded whatever the document's size (chunked_encoding.h), with what a
// tokenizer library may still throw (std::bad_alloc when even a chunk does not fit) turned into
// a status: an exception must not leave an encoder thread, where it would end the process
// without a word and leave the output's temporaries behind.
absl::StatusOr<std::vector<int32_t>> EncodeOrStatus(const Tokenizer& tokenizer,
                                                    const std::string& text,
                                                    int64_t& inexact_cuts) {
  try {
    return EncodeInChunks(tokenizer, text, kDefaultMaxChunkBytes, &inexact_cuts);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory encoding a document of ", text.size(),
                     " bytes: split very long documents, or give the run more memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("the tokenizer failed on a document of ", text.size(), " bytes: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<PreprocessProgress> Preprocess(
    const PreprocessOptions& options, const Tokenizer& tokenizer,
    const std::function<void(const PreprocessProgress&)>& report) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input files");
  const int workers = std::max(1, options.workers);
  const TokenDType dtype =
      tokenizer.vocab_size() < kU16VocabLimit ? TokenDType::kU16 : TokenDType::kI32;
  NF_ASSIGN_OR_RETURN(IndexedDatasetWriter writer,
                      IndexedDatasetWriter::Create(options.output_prefix, dtype));
  const std::optional<int32_t> eod = tokenizer.end_of_document();
  if (options.append_end_of_document && !eod.has_value()) {
    return absl::InvalidArgumentError(
        "the tokenizer has no end-of-document token; pass --no-eod or use a tokenizer with one");
  }
  const std::optional<int32_t> bod = tokenizer.begin_of_document();
  if (options.prepend_begin_of_document && !bod.has_value()) {
    return absl::InvalidArgumentError(
        "the tokenizer has no begin-of-document token; leave out --prepend-begin-of-document or "
        "use a tokenizer with one");
  }

  BatchQueue queue(2 * static_cast<size_t>(workers));
  std::vector<std::thread> encoders;
  for (int w = 0; w < workers; ++w) {
    encoders.emplace_back([&] {
      Batch batch;
      while (queue.Take(batch)) {
        for (const std::string& text : batch.documents) {
          int64_t inexact_cuts = 0;
          auto tokens = EncodeOrStatus(tokenizer, text, inexact_cuts);
          if (!tokens.ok()) {
            batch.status = tokens.status();
            break;
          }
          if (inexact_cuts > 0) batch.inexactly_cut.push_back(batch.tokens.size());
          // Megatron's rule: a document without ids stays without, end-of-document or not (and
          // begin-of-document or not).
          const bool empty = options.keep_empty_documents && tokens->empty();
          if (options.prepend_begin_of_document && !empty) tokens->insert(tokens->begin(), *bod);
          if (options.append_end_of_document && !empty) tokens->push_back(*eod);
          batch.tokens.push_back(*std::move(tokens));
        }
        batch.documents.clear();
        queue.Done(std::move(batch));
      }
    });
  }

  // A reader thread streams documents in; this thread writes encoded batches in input order,
  // so reading, encoding and writing overlap.
  const auto start = std::chrono::steady_clock::now();
  absl::Status read_status;
  std::atomic<int64_t> bytes_read{0};
  std::thread reader([&] {
    Batch batch;
    for (size_t input = 0; input < options.inputs.size(); ++input) {
      auto documents = DocumentReader::Open(options.inputs[input], options.format,
                                            options.json_key, options.keep_empty_documents);
      int64_t ordinal = 0;
      if (!documents.ok()) {
        read_status = documents.status();
        break;
      }
      const int64_t before = bytes_read.load();
      while (read_status.ok()) {
        auto document = (*documents)->Next();
        bytes_read = before + (*documents)->bytes_read();
        if (!document.ok()) {
          read_status = document.status();
        } else if (!document->has_value()) {
          break;
        } else {
          batch.documents.push_back(**std::move(document));
          batch.origins.push_back({.input = input, .ordinal = ++ordinal});
          if (static_cast<int>(batch.documents.size()) == options.documents_per_batch) {
            queue.Push(std::move(batch));
            batch = Batch();
          }
        }
      }
      if (!read_status.ok()) break;
    }
    if (!batch.documents.empty() && read_status.ok()) queue.Push(std::move(batch));
    queue.Close();
  });

  // After an error the loop keeps draining (without writing) so no thread stays blocked.
  absl::Status status;
  PreprocessProgress progress;
  auto last_report = start;
  while (std::optional<Batch> batch = queue.NextInOrder()) {
    if (!batch->status.ok() && status.ok()) status = batch->status;
    progress.inexactly_cut_documents += static_cast<int64_t>(batch->inexactly_cut.size());
    for (const size_t d : batch->inexactly_cut) {
      if (progress.inexactly_cut_names.size() == kNamedInexactlyCutDocuments) break;
      const Origin& origin = batch->origins[d];
      progress.inexactly_cut_names.push_back(absl::StrCat(
          options.inputs[origin.input] == "-" ? "standard input" : options.inputs[origin.input],
          " document ", origin.ordinal));
    }
    for (const std::vector<int32_t>& tokens : batch->tokens) {
      if (!status.ok()) break;
      if (options.keep_empty_documents && tokens.empty()) {
        status = writer.AddEmptyDocument();
        ++progress.empty_documents;
      } else {
        status = writer.AddDocument(tokens);
      }
      ++progress.documents;
      progress.tokens += static_cast<int64_t>(tokens.size());
    }
    const auto now = std::chrono::steady_clock::now();
    if (report && now - last_report > std::chrono::milliseconds(500)) {
      progress.bytes = bytes_read.load();
      progress.seconds = std::chrono::duration<double>(now - start).count();
      report(progress);
      last_report = now;
    }
  }
  reader.join();
  for (std::thread& t : encoders) t.join();
  NF_RETURN_IF_ERROR(read_status);
  NF_RETURN_IF_ERROR(status);
  // A dataset without tokens is never what was meant (an empty file, only blank lines, the wrong
  // --json-key's empty strings, kept or not): refused, and the writer removes its temporaries.
  if (progress.documents == 0) {
    return absl::InvalidArgumentError(
        "no documents in the input (empty, or only blank lines or empty texts): nothing written");
  }
  if (progress.tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the input has ", progress.documents,
                     progress.documents == 1 ? " document, and it is" : " documents, all",
                     " empty (no tokens): nothing written"));
  }
  NF_RETURN_IF_ERROR(writer.Finish());
  progress.bytes = bytes_read.load();
  progress.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report) report(progress);
  return progress;
}

}  // namespace nf::data
