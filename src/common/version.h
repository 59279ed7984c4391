// tau's version, as `tau --version`, the API and every evidence record say it.
#pragma once

namespace tau {

const char* Version();

}  // namespace tau
