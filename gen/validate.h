/* Range and consistency checks of a converted spec (validate.c). */
#ifndef KL_VALIDATE_H
#define KL_VALIDATE_H
#include "klgen.h"
int kl_spec_validate(const kl_spec *s, kl_err *err);
#endif
