#include "model/text_proto.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace nf::model {
namespace {

// Keeps the parser's first error; the parser stops at it, so later ones would only be
// consequences.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(absl::string_view where) : where_(where) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!first_.empty()) return;
    first_ = line < 0 ? absl::StrCat(where_, ": ", message)
                      : absl::StrCat(where_, ":", line + 1, ":", column + 1, ": ", message);
  }

  const std::string& first() const { return first_; }

 private:
  std::string where_;
  std::string first_;
};

}  // namespace

absl::Status ParseTextProto(absl::string_view text, absl::string_view where,
                            google::protobuf::Message& message) {
  FirstErrorCollector errors(where);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (parser.ParseFromString(std::string(text), &message)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      errors.first().empty()
          ? absl::StrCat(where, ": not a valid ", message.GetDescriptor()->name())
          : errors.first());
}

}  // namespace nf::model
