/* family.h - the family table: which kinds a family's layers are made of. */
#ifndef DF_MODEL_FAMILY_H
#define DF_MODEL_FAMILY_H

#include "model/model.h"


/* The kinds of layer l of a model of config c (moe: the layer has routed
 * experts). 0, or DF_EUNSUPPORTED when the family has no such layer. */
int df_family_layer_kind(const df_config *c, int l, int moe, df_layer_kind *out);

#endif
