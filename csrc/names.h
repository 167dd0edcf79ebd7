/* names.h - internal access to the enumeration name tables of names.c. */
#ifndef CHM_NAMES_H
#define CHM_NAMES_H

/* The NULL-terminated names of enumeration kind (enum chm_enum_kind),
 * indexed by value; NULL for an unknown kind. */
const char *const *chm_enum_names(int kind);

/* The option parser's enum tables (the same arrays chm_enum_names gives). */
extern const char *const chm_backend_names[];
extern const char *const chm_mode_names[];
extern const char *const chm_pool_names[];
extern const char *const chm_clock_names[];

#endif /* CHM_NAMES_H */
