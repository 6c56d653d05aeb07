#include "cli/flag_modes.h"

#include <map>
#include <memory>

namespace strata::cli {
namespace {

std::map<const CLI::App*, std::unique_ptr<FlagModes>>& Registry() {
  static std::map<const CLI::App*, std::unique_ptr<FlagModes>> r;
  return r;
}

}  // namespace

FlagModes::FlagModes(CLI::App* cmd) : cmd_(cmd) {
  Declare(kGeneral, "", [] { return true; });
}

FlagModes& FlagModes::Of(CLI::App* cmd) {
  auto& slot = Registry()[cmd];
  if (!slot) slot.reset(new FlagModes(cmd));
  return *slot;
}

const FlagModes* FlagModes::Find(const CLI::App* cmd) {
  auto it = Registry().find(cmd);
  return it == Registry().end() ? nullptr : it->second.get();
}

void FlagModes::Declare(const std::string& group, const std::string& needs,
                        std::function<bool()> applies) {
  modes_.push_back({group, needs, std::move(applies)});
}

CLI::Option* FlagModes::Put(const std::string& group, CLI::Option* opt) {
  opt->group(group);
  return opt;
}

const FlagModes::Mode* FlagModes::ModeOf(const CLI::Option* opt) const {
  for (const Mode& m : modes_)
    if (m.group == opt->get_group()) return &m;
  return nullptr;
}

Status FlagModes::Check() const {
  for (const CLI::Option* o : cmd_->get_options()) {
    if (o == cmd_->get_help_ptr() || o == cmd_->get_help_all_ptr()) continue;
    const Mode* m = ModeOf(o);
    if (!m)
      return Status::Internal("strata " + cmd_->get_name() + ": the flag " + o->get_name() +
                              " belongs to no mode (group '" + o->get_group() + "')");
    if (o->count() > 0 && !m->applies())
      return Status::InvalidArgument(o->get_name() + " applies only " + m->needs);
  }
  return Status::OK();
}

}  // namespace strata::cli
