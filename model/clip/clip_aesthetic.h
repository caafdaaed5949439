/* model/clip/clip_aesthetic.h — the LAION aesthetic predictor (christophschuhmann/improved-aesthetic-predictor):
 * a stack of Linear layers, no activations, applied to the L2-normalised CLIP ViT-L/14 image embedding.
 *
 * Reference: improved-aesthetic-predictor simple_inference.py: MLP.layers = Sequential(Linear(768, 1024),
 * Dropout(0.2), Linear(1024, 128), Dropout(0.2), Linear(128, 64), Dropout(0.1), Linear(64, 16), Linear(16, 1));
 * dropouts are identities at eval; the embedding is divided by its L2 norm (numpy's normalized(): a zero norm
 * counts as 1). The checkpoint (sac+logos+ava1-l14-linearMSE.pth) is a torch state_dict: convert it to safetensors
 * (safetensors.torch.save_file(torch.load(path), out)); its names are layers.<i>.weight / layers.<i>.bias. */
#ifndef MODEL_CLIP_AESTHETIC_H
#define MODEL_CLIP_AESTHETIC_H

typedef struct clip_aesthetic clip_aesthetic;

/* Loads the Linear layers layers.<i>.{weight,bias} of a safetensors file, in increasing i (the Dropout indices
 * between them hold no tensors): each layer's input width must be the previous one's output width and the last
 * output width 1. NULL with core_error naming the file and tensor (missing bias, a shape that does not chain, no
 * layer, more than 16 layers, non-finite value). */
clip_aesthetic *clip_aesthetic_load(const char *path);
void clip_aesthetic_free(clip_aesthetic *a);
/* The input width (768 for ViT-L/14). */
int clip_aesthetic_dim(const clip_aesthetic *a);
/* scores [B] = MLP(embeds[b] / |embeds[b]|), embeds [B, dim] F32 (unnormalised image embeddings). 0 or -1. */
int clip_aesthetic_score(const clip_aesthetic *a, const float *embeds, int B, float *scores);

#endif
