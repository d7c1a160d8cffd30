// braid::Error becomes braid.Error, with braid's message and its code (braid.ErrorCode). The exception class is
// Python code (braid/_error.py) so that Python-side argument checks raise the very same class; the module
// imports it once, here, and keeps it for the translator.
#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include "braid/error.hpp"
#include "bindings.hpp"

namespace braid::python {

void raise_argument(const char* function, const char* argument, const std::string& problem) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: argument '{}' {}", function, argument, problem));
}

void bind_errors(nb::module_& m) {
  nb::module_ errors = nb::module_::import_("braid._error");
  nb::object error_class = errors.attr("Error");
  m.attr("Error") = error_class;
  m.attr("ErrorCode") = errors.attr("ErrorCode");
  // The class lives as long as the interpreter's braid._error module; the translator holds its own reference.
  nb::register_exception_translator(
      [](const std::exception_ptr& caught, void* payload) {
        try {
          std::rethrow_exception(caught);
        } catch (const Error& error) {
          PyObject* type = static_cast<PyObject*>(payload);
          PyObject* instance = PyObject_CallFunction(type, "si", error.what(), static_cast<int>(error.code()));
          if (instance != nullptr) {  // else the failed call's own exception is set and raised instead
            PyErr_SetObject(type, instance);
            Py_DECREF(instance);
          }
        }
      },
      error_class.release().ptr());

  m.def(
      "error_code_name", [](int code) { return std::string(error_code_name(static_cast<ErrorCode>(code))); },
      nb::arg("code"), "braid's name of an error code (error_code_name in braid/error.hpp), e.g. 'invalid argument'.");
}

}  // namespace braid::python
